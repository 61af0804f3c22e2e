"""`trainflow init`: a commented config for a table, read from the table's own schema, that trains as it is."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from trainflow.config import config_from_dict, infer_format, load_yaml
from trainflow.errors import ConfigError
from trainflow.storage import is_uri
from trainflow.tables import infer_task, open_dataset

ID_NAME = re.compile(r"(^|[_\s-])(id|key|uuid)$", re.I)


def _q(text: str) -> str:
    """A YAML scalar for any column name or path, written by YAML's own emitter (it reads back as the same text)."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", text):
        return text
    return yaml.safe_dump(text, default_style='"', allow_unicode=True, width=2**31 - 1).rstrip("\n")


def _comment(text: str) -> str:
    """Text from outside (a path, a column name) safe inside a YAML comment: line breaks and control characters
    escaped, so nothing after them can become a key."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _guess_task(dataset, label: str) -> tuple[str, str]:
    """(task, comment) when the label alone leaves a doubt: few whole-number values read as classes."""
    distinct = pc.count_distinct(dataset.to_table(columns=[label]).column(label)).as_py()
    task = "classification" if distinct <= 20 else "regression"
    return task, (f"the label holds {distinct} distinct whole numbers: {task} is a guess, change it if they are "
                  f"{'quantities' if task == 'classification' else 'classes'}")


def _id_column(schema: pa.Schema, label: str) -> str | None:
    for f in schema:
        if f.name != label and ID_NAME.search(f.name) and (pa.types.is_integer(f.type) or pa.types.is_string(f.type)):
            return f.name
    return None


def scaffold(data: str, label: str, out: str) -> str:
    """The config text for the table at data with label, its relative paths written against out's folder."""
    fmt = infer_format(data)
    path = data if is_uri(data) else str(Path(data).expanduser().resolve())
    if not is_uri(path) and (Path(out).resolve() == Path(path) or Path(path) in Path(out).resolve().parents):
        raise ConfigError(f"--out {out} is the table --data {data} (or inside it): init never writes over its input; "
                          "choose another file for the config")
    dataset = open_dataset(path, fmt)
    schema = dataset.schema
    try:
        task, why = infer_task(path, fmt, label, dataset=dataset)
        task_comment = f"{why} (leave task out and trainflow infers the same)"
    except ConfigError:
        if label not in schema.names:
            raise
        task, task_comment = _guess_task(dataset, label)
    folder = Path(out).resolve().parent
    where = path if is_uri(path) else os.path.relpath(path, folder)
    stem = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "model"
    id_col = _id_column(schema, label)
    features = [n for n in schema.names if n not in (label, id_col)]
    rows = dataset.count_rows()
    lines = [
        f"# trainflow config for {_comment(path)}: {rows:,} rows, {len(schema.names)} columns; written by `trainflow init`.",
        "# Every key with its meaning: `trainflow config schema`; this file resolved: `trainflow config show --config FILE`;",
        "# every check short of training: `trainflow validate --config FILE`. Relative paths resolve against this folder.",
        "data:",
        f"  path: {_q(where)}",
        f"  label: {_q(label)}",
        (f"  id_column: {_q(id_col)}                # carried into the predictions and the split's key" if id_col else
         "  # id_column: ...                # a column carried into the predictions (and the split's key)"),
        f"  # features: [{', '.join(_q(f) for f in features[:6])}{', ...' if len(features) > 6 else ''}]"
        "   # default: every column but the label and id",
        f"task: {task}                    # {_comment(task_comment)}",
        "model:",
        "  type: auto                      # mlp, xgboost, lightgbm and catboost, each trained, and their weighted ensemble;",
        "                                  # the best on the validation split goes on (one family, e.g. catboost, trains faster)",
        "# train: the epochs, batch size and schedule are sized to the table; set train.epochs etc. to override",
        "scaling:",
        "  num_workers: 2                  # Ray Train workers (each a process with a share of the data)",
        "  use_gpu: false",
        "storage_path: runs                # Ray Train runs and checkpoints; an existing run name resumes",
        "mlflow:",
        "  # tracking_uri: sqlite:///mlflow.db   # default: mlflow.db beside storage_path",
        f"  experiment: {stem}",
        f"  registered_model: {stem}-model  # versions, and the @champion alias the gate moves",
        "# inference:                      # after each retrain, the champion predicts every row of input",
        "#   input: path/to/score.parquet",
        f"#   output: predictions/{stem}",
    ]
    text = "\n".join(lines) + "\n"
    config_from_dict(load_yaml(text), base_dir=folder, source=out)  # what init writes always loads
    return text
