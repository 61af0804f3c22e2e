"""The way in: `trainflow init`, `config schema`, `config show`, `validate`, and the task a label implies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import yaml

from tests.conftest import churn_config, write_parquet
from trainflow.config import config_from_dict, load_config
from trainflow.errors import ConfigError
from trainflow.flows.cli import main as cli_main
from trainflow.tables.sample import make_churn_table


def _raw(path, label="y", **extra):
    return {"data": {"path": str(path), "label": label}, **extra}


@pytest.mark.parametrize(
    "values, task, why",
    [
        (["a", "b", "a"], "classification", "text values"),
        ([True, False, True], "classification", "bool values"),
        ([0, 1, 1], "classification", "2 distinct whole numbers"),
        ([1.5, 2.0, 3.25], "regression", "fractional numbers"),
        ([0.0, 1.0, None], "classification", "2 distinct whole numbers"),
    ],
)
def test_task_is_inferred_from_an_unambiguous_label_and_said(tmp_path, values, task, why):
    path = write_parquet(pa.table({"x": list(range(len(values))), "y": values}), tmp_path / "t.parquet")
    cfg = config_from_dict(_raw(path))
    assert cfg.task == task and why in cfg.task_inferred
    # a written task is taken as it is, and nothing is said
    other = "regression" if task == "classification" else "classification"
    if task == "classification" and why == "2 distinct whole numbers":
        assert config_from_dict(_raw(path, task=other)).task_inferred is None


def test_an_ambiguous_or_missing_label_asks_for_task(tmp_path):
    path = write_parquet(pa.table({"x": np.arange(50), "y": np.arange(50) % 5}), tmp_path / "t.parquet")
    with pytest.raises(ConfigError, match=r"5 distinct whole numbers.*set task: classification or task: regression"):
        config_from_dict(_raw(path))
    with pytest.raises(ConfigError, match=r"data.label: 'nope' is not a column of .*t.parquet"):
        config_from_dict(_raw(path, label="nope"))
    assert config_from_dict(_raw(path, task="classification")).task == "classification"


def test_config_schema_describes_every_key_and_show_resolves_without_secrets(tmp_path, capsys):
    assert cli_main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    missing = []

    def walk(node, where):
        for name, prop in node.get("properties", {}).items():
            if not prop.get("description"):
                missing.append(f"{where}{name}")

    walk(schema, "")
    for name, definition in schema["$defs"].items():
        walk(definition, f"{name}.")
    assert not missing
    assert "task" not in schema["required"] and "data" in schema["required"]
    cfg = churn_config(tmp_path)
    raw = yaml.safe_load(cfg.read_text())
    raw.pop("task")
    raw["scaling"]["env_vars"] = {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}
    cfg.write_text(yaml.safe_dump(raw))
    assert cli_main(["config", "show", "--config", str(cfg), "--set", "model.params.mlp.epochs=7"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# task: classification (the label 'churned' holds 2 distinct whole numbers")
    shown = yaml.safe_load(out)
    assert shown["model"]["epochs"] == 7 and shown["data"]["path"] == str(tmp_path / "data" / "train.parquet")
    assert shown["checkpoint"]["mode"] == "min" and shown["promotion"]["metric"] == "val_loss"  # resolved defaults
    assert "s3cr3t-value" not in out and shown["scaling"]["env_vars"]["AWS_SECRET_ACCESS_KEY"] == "***"


def test_each_key_is_described_once_and_the_docs_table_and_init_comments_are_made_from_it(tmp_path):
    from trainflow.config import schema as config_schema

    # the docs' key table is what the config's descriptions make: a key added or re-described without
    # `python -m trainflow.config.schema --write` fails here
    docs = config_schema.DOCS.read_text()
    assert config_schema.docs_with_table(docs) == docs
    table = config_schema.key_table()
    assert "| `model.params.max_depth` | the library's | xgboost, lightgbm and catboost's own `max_depth`" in table
    assert "| `train.folds` | `auto` | cross-fitting:" in table and "| `data.label` | required |" in table
    # the schema's descriptions are the same text
    schema = config_schema.config_schema()
    assert schema["$defs"]["TrainSection"]["properties"]["folds"]["description"] == config_schema.description(
        "train.folds"
    )
    assert config_schema.description("train.nope") is None
    # init's comments are the first clause of the same descriptions
    write_parquet(make_churn_table(120, seed=2), tmp_path / "churn.parquet")
    assert (
        cli_main(
            ["init", "--data", str(tmp_path / "churn.parquet"), "--label", "churned", "--out", str(tmp_path / "c.yaml")]
        )
        == 0
    )
    text = (tmp_path / "c.yaml").read_text()
    for key in ("scaling.num_workers", "storage_path", "mlflow.registered_model", "data.id_column"):
        assert f"# {config_schema.brief(key)}" in text, key


def test_init_writes_a_commented_config_that_loads_and_never_replaces_one(tmp_path, capsys):
    write_parquet(make_churn_table(300, seed=1), tmp_path / "tables" / "churn.parquet")
    out = tmp_path / "conf" / "churn.yaml"
    args = ["init", "--data", str(tmp_path / "tables" / "churn.parquet"), "--label", "churned", "--out", str(out)]
    assert cli_main(args) == 0
    text = out.read_text()
    assert "# trainflow config for" in text and "300 rows" in text
    cfg = load_config(out)
    assert cfg.task == "classification" and cfg.data.id_column == "customer_id"
    assert cfg.data.path == str(tmp_path / "tables" / "churn.parquet")  # written relative to the config's folder
    assert yaml.safe_load(text)["data"]["path"] == "../tables/churn.parquet"
    assert cfg.storage_path == str(tmp_path / "conf" / "runs") and cfg.mlflow.registered_model == "churned-model"
    out.write_text("# mine\n")
    capsys.readouterr()
    assert cli_main(args) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "# mine\n"
    assert cli_main([*args, "--force"]) == 0 and load_config(out).task == "classification"
    # a label that is not a column: exit 2 naming it, nothing written
    assert cli_main([*args[:-2], "--out", str(tmp_path / "other.yaml"), "--label", "churn"]) == 2
    assert "'churn' is not a column" in capsys.readouterr().err and not (tmp_path / "other.yaml").exists()
    # a table with no label value to tell the task from (every one missing; no rows): refused, no task guessed
    table = make_churn_table(300, seed=1)
    unlabelled = table.set_column(table.schema.get_field_index("churned"), "churned", pa.nulls(300, pa.int64()))
    for rows, needle in ((unlabelled, "has no value in any of its 300 rows"), (table.slice(0, 0), "has no rows")):
        write_parquet(rows, tmp_path / "tables" / "churn.parquet")
        assert cli_main([*args[:-2], "--out", str(tmp_path / "other.yaml")]) == 2
        assert needle in capsys.readouterr().err and not (tmp_path / "other.yaml").exists()


@pytest.mark.usefixtures("prefect_harness", "ray_local")
def test_validate_runs_every_check_short_of_training(tmp_path, capsys):
    cfg = churn_config(tmp_path, rows=600)
    summary_path = tmp_path / "validate.json"
    assert cli_main(["validate", "--config", str(cfg), "--summary-json", str(summary_path)]) == 0
    summary = json.loads(summary_path.read_text())
    assert (
        summary["valid"]
        and summary["rows"] == 600
        and summary["train_rows"] + summary["validation_rows"] + summary["test_rows"] == 600
    )
    assert set(summary["families"]) == {"mlp"} and summary["families"]["mlp"]["epochs"] == 3
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()  # nothing trained, nothing written
    printed = capsys.readouterr().out  # a summary a person reads; the JSON is behind --summary-json
    assert "  valid             yes" in printed and "  families          mlp" in printed and "{" not in printed
    # a scoring table without a feature the model needs: exit 2 naming the file and column, before any training
    write_parquet(
        make_churn_table(50, seed=3, with_label=False).drop_columns(["plan"]), tmp_path / "data" / "score.parquet"
    )
    capsys.readouterr()
    assert cli_main(["validate", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "score.parquet" in err and "'plan'" in err


def test_init_never_replaces_a_file_that_appeared_while_it_wrote(tmp_path):
    # the exists check runs before the table is read; the write itself (a hard link of the finished temp file)
    # fails too when the file appeared in between, and leaves no temp file behind
    from trainflow.errors import TrainflowError
    from trainflow.flows.cli.output import write_out as write_text_atomic

    target = tmp_path / "trainflow.yaml"
    target.write_text("theirs\n")
    with pytest.raises(TrainflowError, match="exists; choose another file or add --force"):
        write_text_atomic(str(target), "ours\n", replace=False)
    assert target.read_text() == "theirs\n" and [p.name for p in tmp_path.iterdir()] == ["trainflow.yaml"]
    write_text_atomic(str(tmp_path / "new.yaml"), "ours\n", replace=False)
    assert (tmp_path / "new.yaml").read_text() == "ours\n" and len(list(tmp_path.iterdir())) == 2


def test_every_cli_option_says_what_it_does():
    import argparse

    from trainflow.flows.cli import build_parser as _parser

    missing = []

    def walk(parser: argparse.ArgumentParser, where: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{where} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")

    walk(_parser(), "trainflow")
    assert missing == []
    with pytest.raises(SystemExit) as done:  # --version: the installed package's
        _parser().parse_args(["--version"])
    assert done.value.code == 0


def test_a_misspelled_column_is_refused_from_the_files_metadata_before_anything_starts(tmp_path, capsys):
    """A label, id or scoring column the tables lack: exit 2 naming the file, the column and the closest name, from
    the Parquet footers alone, before Ray or a Prefect server starts."""
    cfg = churn_config(tmp_path, rows=300)
    for setting, needle in (
        ("data.label=churn", "train.parquet: label column 'churn' not found; did you mean 'churned'?"),
        ("data.id_column=customerid", "train.parquet: id column 'customerid' not found; did you mean 'customer_id'?"),
        (
            "promotion.slices=[regoin]",
            "promotion.slices names column(s) ['regoin'] that the table lacks; did you mean 'region'?",
        ),
    ):
        for command in ("retrain", "validate"):
            assert cli_main([command, "--config", str(cfg), "--set", setting]) == 2
            assert needle in capsys.readouterr().err
    write_parquet(
        make_churn_table(50, seed=3, with_label=False).drop_columns(["age"]), tmp_path / "data" / "score.parquet"
    )
    # as a user runs it: a fresh process, no Prefect API (Prefect's INFO lines would say "Starting temporary server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")} | {"PREFECT_LOGGING_LEVEL": "INFO"}
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow.flows.cli", "retrain", "--config", str(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "score.parquet: column(s) ['age'] not found" in proc.stderr, proc.stderr
    assert "Ray dashboard" not in proc.stderr and "temporary server" not in proc.stderr
    assert not (tmp_path / "runs").exists()
    # the label's values against the task, from the label column alone (a small table): one class
    write_parquet(make_churn_table(50, seed=3, with_label=False), tmp_path / "data" / "score.parquet")
    one = make_churn_table(300, seed=1)
    write_parquet(
        one.set_column(one.schema.get_field_index("churned"), "churned", pa.array([1] * 300)),
        tmp_path / "data" / "train.parquet",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow.flows.cli", "retrain", "--config", str(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "label column 'churned' has only one class (['1']) in its 300 rows" in proc.stderr
    assert "Ray dashboard" not in proc.stderr and "temporary server" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_dated_table_is_noticed_init_writes_split_time_column_and_hash_roles_say_so(tmp_path):
    import datetime as dt

    from trainflow.config import load_config
    from trainflow.scaffold import scaffold
    from trainflow.tasks.split import time_hint

    n = 300
    table = pa.table(
        {
            "when": [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)],
            "x": np.arange(n, dtype=np.float64),
            "y": np.arange(n) % 2,
        }
    )
    write_parquet(table, tmp_path / "t.parquet")
    out = tmp_path / "c.yaml"
    text = scaffold(str(tmp_path / "t.parquet"), "y", str(out))
    assert yaml.safe_load(text)["split"]["time_column"] == "when"
    assert "not a random sample of all times" in text and "delete these two lines" in text  # why, and the way back
    out.write_text(text)
    assert load_config(out).split.time_column == "when" and time_hint(load_config(out), ["when"]) is None
    hashed = load_config(out, {"split.time_column": None})
    assert "set split.time_column: when" in time_hint(hashed, ["when"])


def test_a_small_tables_retrain_runs_in_its_process_and_starts_no_ray(tmp_path, prefect_home):
    """A table this process reads, every fit in Ray Train's local mode and the scoring table scored here: a retrain
    as a user starts it (a fresh process, Prefect's temporary server) trains, registers and predicts every row
    without starting Ray (docs/performance.md#local-mode). A worker group's fit, a cluster, or a streamed table start
    Ray as before."""
    from trainflow.config import load_config
    from trainflow.flows.local import trained_in_process

    cfg = churn_config(
        tmp_path,
        rows=400,
        model={"type": ["xgboost", "mlp"], "params": {"xgboost": {"num_boost_round": 20}}},
        network={"epochs": 2, "batch_size": 64},
        train={"folds": 2},
    )
    assert trained_in_process(load_config(cfg))
    for setting in ("scaling.num_workers=2", "scaling.local_mode=false", "ray.address=127.0.0.1:6379"):
        assert not trained_in_process(load_config(cfg, {setting.split("=")[0]: yaml.safe_load(setting.split("=")[1])}))
    assert not trained_in_process(load_config(cfg, {"data.materialize": "never"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"PREFECT_LOGGING_LEVEL": "INFO", "PREFECT_HOME": str(prefect_home)}  # (a migrated Prefect database)
    summary = tmp_path / "s.json"
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow.flows.cli", "retrain", "--config", str(cfg), "--summary-json", str(summary)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Ray dashboard" not in proc.stderr and "Started a local Ray instance" not in proc.stderr, proc.stderr[-3000:]
    assert "training set held in this process" in proc.stderr and "temporary server" in proc.stderr
    # each epoch and round said once, in trainflow's own line; Ray Train's local mode adds none at INFO
    assert "mlp fold 2/2 epoch 2/2" in proc.stderr and "xgboost fold 1/2 round" in proc.stderr, proc.stderr[-3000:]
    assert "Reported metrics" not in proc.stderr and "Running in local mode" not in proc.stderr, proc.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["model_version"] == "1" and s["output_rows"] == s["input_rows"] == 500
    assert {c["family"] for c in s["candidates"]} >= {"xgboost", "mlp"}
