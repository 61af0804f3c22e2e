"""`trainflow init`: a commented config for a table, read from the table's own schema, that trains as it is."""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from trainflow.config import config_from_dict, infer_format, load_yaml
from trainflow.config.schema import brief, default_of
from trainflow.errors import ConfigError
from trainflow.run.storage import is_uri
from trainflow.tables.files import infer_task, open_dataset

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


def _wrapped(text: str, room: int) -> list[str]:
    return textwrap.wrap(text, room, break_long_words=False, break_on_hyphens=False)


def _noted(line: str, note: str, width: int = 118, column: int = 34) -> list[str]:
    """line with note as a comment from column on, wrapped onto comment lines of its own within width; a line too
    long for that gets its comment on the lines above it."""
    if len(line) >= column:
        indent = " " * (len(line) - len(line.lstrip()))
        return [f"{indent}# {part}" for part in _wrapped(note, width - len(indent) - 2)] + [line]
    if not line:
        return [f"# {part}" for part in _wrapped(note, width - 2)]
    parts = _wrapped(note, width - column - 2)
    return [f"{line.ljust(column)}# {parts[0]}"] + [f"{' ' * column}# {part}" for part in parts[1:]]


def _guess_task(dataset, label: str, doubt: ConfigError) -> tuple[str, str]:
    """(task, comment) when the label alone leaves a doubt: few whole-number values read as classes; doubt raised
    when the label holds no value at all (an empty table, every label missing: nothing to guess from)."""
    distinct = pc.count_distinct(dataset.to_table(columns=[label]).column(label)).as_py()
    if not distinct:
        raise doubt
    task = "classification" if distinct <= 20 else "regression"
    return task, (
        f"the label holds {distinct} distinct whole numbers: {task} is a guess, change it if they are "
        f"{'quantities' if task == 'classification' else 'classes'}"
    )


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
        raise ConfigError(
            f"--out {out} is the table --data {data} (or inside it): init never writes over its input; "
            "choose another file for the config"
        )
    dataset = open_dataset(path, fmt)
    schema = dataset.schema
    try:
        task, why = infer_task(path, fmt, label, dataset=dataset)
        task_comment = f"{why} (leave task out and trainflow infers the same)"
    except ConfigError as doubt:
        if label not in schema.names:
            raise
        task, task_comment = _guess_task(dataset, label, doubt)
    folder = Path(out).resolve().parent
    where = path if is_uri(path) else os.path.relpath(path, folder)
    stem = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "model"
    id_col = _id_column(schema, label)
    time_col = next(
        (
            f.name
            for f in schema
            if f.name not in (label, id_col) and (pa.types.is_date(f.type) or pa.types.is_timestamp(f.type))
        ),
        None,
    )
    features = [n for n in schema.names if n not in (label, id_col)]
    rows = dataset.count_rows()
    shown = ", ".join(_q(f) for f in features[:6]) + (", ..." if len(features) > 6 else "")
    lines = [
        f"# trainflow config for {_comment(path)}: {rows:,} rows, {len(schema.names)} columns; written by `trainflow init`.",
        "# Every key with its meaning: `trainflow config schema`; this file resolved: `trainflow config show --config FILE`;",
        "# every check short of training: `trainflow validate --config FILE`. Relative paths resolve against this folder.",
        "data:",
        *_noted(f"  path: {_q(where)}", brief("data.path")),
        *_noted(f"  label: {_q(label)}", brief("data.label")),
        *_noted(f"  id_column: {_q(id_col)}" if id_col else "  # id_column: ...", brief("data.id_column")),
        *_noted(f"  # features: [{shown}]", f"default: {default_of('data.features')}"),
        *_noted(f"task: {task}", _comment(task_comment)),
        *(
            [
                "split:",
                *_noted(
                    f"  time_column: {_q(time_col)}",
                    f"{_comment(time_col)} holds dates: the newest rows are the test role, like the rows a model "
                    "meets next, not a random sample of all times; delete these two lines for roles by a hash "
                    "of each row's id or values",
                ),
            ]
            if time_col
            else []
        ),
        "model:",
        *_noted("  type: auto", brief("model.type")),
        *_noted("", f"train: {brief('train')}"),
        "scaling:",
        *_noted("  num_workers: 2", brief("scaling.num_workers")),
        *_noted("  use_gpu: false", brief("scaling.use_gpu")),
        *_noted("storage_path: runs", brief("storage_path")),
        "mlflow:",
        *_noted("  # tracking_uri: ...", f"default: {default_of('mlflow.tracking_uri')}"),
        *_noted(f"  experiment: {stem}", brief("mlflow.experiment")),
        *_noted(f"  registered_model: {stem}-model", brief("mlflow.registered_model")),
        *_noted("# inference:", brief("inference")),
        "#   input: path/to/score.parquet",
        f"#   output: predictions/{stem}",
    ]
    text = "\n".join(lines) + "\n"
    config_from_dict(load_yaml(text), base_dir=folder, source=out)  # what init writes always loads
    return text
