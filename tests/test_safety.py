"""Unattended runs cannot hurt: outputs that replace only trainflow's own files, and a champion gate that is an
honest compare-and-set. Real Ray Data writes, a real Prefect server (the locks), real MLflow on SQLite."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest
import ray.data
import torch

from tests.conftest import write_config, write_parquet
from trainflow.config import config_from_dict, load_config
from trainflow.run.tracking import tracking
from trainflow.errors import DataError, InfrastructureError
from trainflow.roles.folds import FoldPlan
from trainflow.tables.outputs import MANIFEST, guard_output, read_manifest, write_output

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_local")


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.normal(size=rows)})


def _config(tmp_path: Path, output: str, **extra) -> object:
    write_parquet(_table(50), tmp_path / "shared" / "train.parquet")
    write_parquet(_table(20, 1), tmp_path / "shared" / "score.parquet")
    (tmp_path / "shared" / "notes.txt").write_text("my notes")
    raw = {
        "data": {"path": "../shared/train.parquet", "label": "x"},
        "task": "regression",
        "storage_path": "../runs",
        "model": {"type": "mlp"},
        "inference": {"input": "../shared/score.parquet", "output": output},
        **extra,
    }
    (tmp_path / "configs").mkdir()
    return load_config(write_config(tmp_path / "configs", raw))


@pytest.mark.parametrize(
    "output, overlaps",
    [
        ("../shared", "data.path"),  # the folder holding the inputs and a user's file
        ("../shared/score.parquet", "inference.input"),  # the scoring table itself
        ("..", "data.path"),  # a parent of everything
        ("../runs/predictions", "storage_path"),  # inside Ray Train's storage
        ("../mlartifacts", "the MLflow store"),  # MLflow's artifact folder next to its database
        (".", "the config's folder"),  # the folder holding the config
    ],
)
def test_an_output_that_overlaps_the_run_is_refused_and_nothing_is_touched(tmp_path, output, overlaps):
    config = _config(tmp_path, output)
    before = _snapshot(tmp_path)
    with pytest.raises(DataError, match=f"overlaps {overlaps}") as err:
        guard_output(config.inference.output, config)
    assert config.inference.output in str(err.value)
    assert _snapshot(tmp_path) == before


def test_outputs_replace_only_trainflows_own_and_survive_every_failure(tmp_path, monkeypatch):
    import trainflow.tables.outputs as outputs

    config = _config(tmp_path, "../predictions")
    out = Path(config.inference.output)
    # a folder of a user's own (no manifest) is never replaced
    out.mkdir()
    (out / "mine.csv").write_text("a,b\n")
    before = _snapshot(tmp_path)
    with pytest.raises(DataError, match="holds files trainflow did not write \\(mine.csv\\)"):
        write_output(ray.data.from_arrow(_table(10)), str(out), 10, {"model": "m"}, config)
    assert _snapshot(tmp_path) == before
    (out / "mine.csv").unlink()

    # first and second writes: the manifest says what is there; the old files are gone, nothing left beside
    assert write_output(ray.data.from_arrow(_table(10)), str(out), 10, {"model": "v1"}, config) == 10
    assert read_manifest(str(out))["model"] == "v1"
    assert write_output(ray.data.from_arrow(_table(12, 3)), str(out), 12, {"model": "v2"}, config) == 12
    manifest = read_manifest(str(out))
    assert (manifest["model"], manifest["rows"]) == ("v2", 12)
    assert pads.dataset(out).to_table().num_rows == 12
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["configs", "shared", "predictions"])
    good = _snapshot(out)

    # a write that fails (a row count that does not match, a batch that raises, a crash at the swap) leaves the
    # previous output byte-identical and no staging folder behind
    with pytest.raises(DataError, match="wrote 5 rows for 6 input rows"):
        write_output(ray.data.from_arrow(_table(5)), str(out), 6, {"model": "v3"}, config)

    def boom(batch):
        raise RuntimeError("disk gone")

    with pytest.raises(Exception, match="disk gone"):
        write_output(ray.data.from_arrow(_table(5)).map_batches(boom), str(out), 5, {"model": "v3"}, config)
    monkeypatch.setattr(outputs, "exchange", lambda a, b: (_ for _ in ()).throw(OSError("crash at the swap")))
    with pytest.raises(OSError, match="crash at the swap"):
        write_output(ray.data.from_arrow(_table(5)), str(out), 5, {"model": "v3"}, config)
    assert _snapshot(out) == good
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["configs", "shared", "predictions"])

    # where the filesystem cannot swap atomically, two renames do it, and the result is the same
    monkeypatch.setattr(outputs, "exchange", lambda a, b: False)
    assert write_output(ray.data.from_arrow(_table(7)), str(out), 7, {"model": "v4"}, config) == 7
    assert read_manifest(str(out))["model"] == "v4" and pads.dataset(out).to_table().num_rows == 7
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["configs", "shared", "predictions"])
    assert (out / MANIFEST).is_file()


# ---- the champion gate -------------------------------------------------------------------------------------


def _gate_setup(tmp_path, table=None, **sections):
    """A regression table where y = x (or the table given, feature x), a fitted preprocessor, and a linear 'model'
    per quality: the weight on x decides how good it is. Checkpoints are written with trainflow's own checkpoint
    code, registered with its pyfunc. sections: more config."""
    from trainflow.preprocessors.fit import fit_preprocessor
    from trainflow.tables.files import table_spec
    from trainflow.trainer.serving.checkpoint import save_checkpoint

    rng = np.random.default_rng(0)
    x = rng.normal(size=400)
    table = pa.table({"x": x, "y": x + rng.normal(0, 0.05, 400)}) if table is None else table
    write_parquet(table, tmp_path / "t.parquet")
    cfg = load_config(
        write_config(
            tmp_path,
            {
                "data": {"path": "t.parquet", "label": "y", "features": ["x"]},
                "task": "regression",
                "split": {"seed": 0, "test_fraction": 0.5, "validation_fraction": 0.2},
                "model": {"type": "mlp", "hidden_sizes": [], "numeric_embedding": "none"},
                "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "registered_model": "gate"},
                **sections,
            },
        )
    )
    ds = ray.data.from_arrow(table)
    spec = table_spec(table.schema, cfg.data, cfg.task, "t")
    prep = fit_preprocessor(ds, spec, cfg.task)
    # every model here was trained under one plan whose test rows are the gate's holdout (keyed as a run keys a
    # table without an id column: its features, then the label)
    plan = FoldPlan(seed=0, key_columns=("x", "y"), test_fraction=0.5, validation_fraction=0.2)
    ds = ray.data.from_arrow(table.filter(pa.array(plan.held_out(table))))

    def checkpoint(weight: float, seed: int = 0) -> str:
        """A checkpoint trained under the plan with this seed (its split.json and config.json say so)."""
        d = tmp_path / (f"ckpt-{weight}" if seed == 0 else f"ckpt-{weight}-seed{seed}")
        d.mkdir(exist_ok=True)
        replace(plan, seed=seed).save(d)
        state = {"0.weight": torch.tensor([[weight]], dtype=torch.float32), "0.bias": torch.zeros(1)}
        trained = cfg.for_family("mlp").to_dict()
        trained["split"]["seed"] = seed
        save_checkpoint(d, state, {"epoch": 0}, {"val_loss": 0.0}, [], prep.to_dict(), trained)
        return str(d)

    return cfg, ds, checkpoint


def _register(cfg, path: str):
    from trainflow.tasks.values import Registered
    from trainflow.tasks.model_package import MODEL_CODE, requirements
    from trainflow.run.tracking import ensure_experiment, tracking

    with tracking(cfg.mlflow.tracking_uri):
        exp = ensure_experiment(cfg.mlflow.tracking_uri, "gate")
        with mlflow.start_run(experiment_id=exp) as run:  # (requirements as register gives them: none inferred)
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=MODEL_CODE,
                artifacts={"checkpoint": path},
                pip_requirements=requirements(["mlp"]),
                registered_model_name=cfg.mlflow.registered_model,
            )
    return Registered(run.info.run_id, cfg.mlflow.registered_model, str(info.registered_model_version), "")


def _champion(cfg) -> str | None:
    client = mlflow.MlflowClient(tracking_uri=cfg.mlflow.tracking_uri)
    try:
        return str(client.get_model_version_by_alias(cfg.mlflow.registered_model, "champion").version)
    except mlflow.exceptions.MlflowException:
        return None


def test_the_gate_is_an_honest_compare_and_set(tmp_path, monkeypatch):
    import trainflow.tasks.promote as promote

    cfg, holdout, checkpoint = _gate_setup(tmp_path)
    first = promote.gate(cfg, holdout, checkpoint(0.5), _register(cfg, checkpoint(0.5)))
    assert (first.decision, first.reason, _champion(cfg)) == ("promoted", "first model: there is no champion yet", "1")

    # a registry error between the read and the move (the store failing under the gate: its alias table is gone
    # for a moment) fails the gate with the alias where it was; it is never read as "no champion"
    challenger = checkpoint(0.9)
    registered = _register(cfg, challenger)
    db = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)

    def break_the_registry(version):
        db.execute("ALTER TABLE registered_model_aliases RENAME TO aliases_away")

    monkeypatch.setattr(promote, "_before_alias_move", break_the_registry)
    with pytest.raises(InfrastructureError, match="cannot read gate@champion"):
        promote.gate(cfg, holdout, challenger, registered)
    db.execute("ALTER TABLE aliases_away RENAME TO registered_model_aliases")
    db.close()
    assert _champion(cfg) == "1"

    # two challengers promoted at once, the worse one slow between scoring and moving the alias: the better
    # one ends as champion (the second gate waits for the lock, then compares against the first's winner)
    worse, better = _register(cfg, checkpoint(0.8)), _register(cfg, checkpoint(1.0))
    paths = {worse.model_version: str(tmp_path / "ckpt-0.8"), better.model_version: str(tmp_path / "ckpt-1.0")}
    start = threading.Barrier(2)
    monkeypatch.setattr(
        promote, "_before_alias_move", lambda version: time.sleep(3) if version == worse.model_version else None
    )
    results, errors = {}, []

    def run(reg):
        try:
            start.wait()
            results[reg.model_version] = promote.gate(cfg, holdout, paths[reg.model_version], reg)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in (worse, better)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert _champion(cfg) == better.model_version
    assert results[better.model_version].decision == "promoted"
    loser = results[worse.model_version]
    assert (
        loser.decision == "not_promoted" or loser.serving_version == worse.model_version
    )  # promoted first, then beaten


def test_a_floor_keeps_a_weak_model_from_champion_the_first_one_included(tmp_path):
    import trainflow.tasks.promote as promote

    cfg, holdout, checkpoint = _gate_setup(tmp_path)
    cfg = cfg.model_copy(update={"promotion": cfg.promotion.model_copy(update={"min_score": 0.1})})  # val_loss <= 0.1
    weak = promote.gate(cfg, holdout, checkpoint(0.5), _register(cfg, checkpoint(0.5)))
    assert (weak.decision, weak.below_floor, weak.serving_version, _champion(cfg)) == ("not_promoted", True, None, None)
    assert "misses the floor promotion.min_score 0.1" in weak.reason and weak.challenger_score > 0.1
    tags = mlflow.MlflowClient(tracking_uri=cfg.mlflow.tracking_uri).get_model_version("gate", "1").tags
    assert tags["trainflow.promotion.floor"] == "missed (val_loss 0.1)"
    good = promote.gate(cfg, holdout, checkpoint(1.0), _register(cfg, checkpoint(1.0)))
    assert (good.decision, good.below_floor, _champion(cfg)) == ("promoted", False, "2")
    # the floor rule's line in the summary (tasks/gate_rules.py), printed under the decision
    from trainflow.flows.cli.render import format_summary

    said = {"rule": "floor", "line": "floor: {} (val_loss at least as good as promotion.min_score 0.1)"}
    assert weak.checks == [{**said, "line": said["line"].format("missed")}]
    assert good.checks == [{**said, "line": said["line"].format("met")}]
    assert " floor: met (val_loss" in format_summary({"promotion": good.record()})
    # the model card says why nothing serves while no version has met the floor
    from trainflow.tasks.report import _serving_line

    assert "No version is `@champion`" in _serving_line(weak.record()) and "missed" in _serving_line(weak.record())
    assert _serving_line(good.record()).startswith("`@champion` is now version 2. Floor promotion.min_score 0.1: met")


def test_the_gate_judges_slices_and_noise(tmp_path):
    import trainflow.tasks.promote as promote

    # group a: y = x on small x; group b: y = 1.4 x on large x. The champion fits a (weight 1.0); the challenger
    # (weight 1.3) is far better on average, carried by b's large errors, and worse on a
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0, 0.3, 300), rng.normal(0, 3.0, 300)])
    group = np.array(["a"] * 300 + ["b"] * 300)
    y = np.where(group == "a", x, 1.4 * x) + rng.normal(0, 0.01, 600)
    table = pa.table({"x": x, "group": group, "y": y})
    cfg, holdout, checkpoint = _gate_setup(tmp_path, table, promotion={"slices": ["group"], "max_slice_drop": 0.0002})
    scale = float(np.std(y) / np.std(x))  # weights are on standardized x and y
    assert (
        promote.gate(cfg, holdout, checkpoint(1.0 / scale), _register(cfg, checkpoint(1.0 / scale))).decision
        == "promoted"
    )
    challenger = checkpoint(1.3 / scale)
    result = promote.gate(cfg, holdout, challenger, _register(cfg, challenger))
    assert result.decision == "not_promoted" and _champion(cfg) == "1", (result.reason, result.slices)
    held = pa.concat_tables(ray.get(holdout.to_arrow_refs()))
    rows = {g: int(pc.sum(pc.equal(held["group"], g)).as_py()) for g in ("a", "b")}  # the test rows of each group
    assert result.rows == held.num_rows == rows["a"] + rows["b"] and min(rows.values()) > 100
    assert (
        result.reason.startswith(f"on the slice group=a ({rows['a']} rows) its val_loss")
        and "max_slice_drop 0.0002" in result.reason
    )
    assert result.challenger_score < result.champion_score  # better on average
    a, b = result.slices["group"]["a"], result.slices["group"]["b"]
    assert (a["rows"], b["rows"]) == (rows["a"], rows["b"]) and a["judged"] and a["val_loss"] > a["champion_val_loss"]
    assert b["val_loss"] < b["champion_val_loss"]
    # without the slice rule it wins, and by far more than the holdout's noise
    loose = cfg.model_copy(update={"promotion": cfg.promotion.model_copy(update={"max_slice_drop": None})})
    won = promote.gate(loose, holdout, challenger, _register(cfg, challenger))
    assert won.decision == "promoted" and won.confidence["share_not_better"] == 0.0 and won.confidence["gain_p05"] > 0
    assert won.confidence["paired"] is True
    assert won.checks == [
        {
            "rule": "confidence",
            "line": "confidence: beats the champion by more than 0 in 100% of 100 paired bootstrap resamples "
            "(promotion.confidence 0.95)",
        }
    ]
    assert result.checks == []  # the slice rule kept it out before the bootstrap ran
    # a challenger that differs from the champion by noise only is kept out by promotion.confidence: the weight
    # mirrored across the best one fits as well on average, and wins on about half of the resampled holdouts
    from trainflow.preprocessors.tabular import TabularPreprocessor

    prep = TabularPreprocessor.load(challenger)
    hx, hy = held["x"].to_numpy(), held["y"].to_numpy()  # the judged rows' best weight
    xs = (hx - prep.numeric["x"]["mean"]) / prep.numeric["x"]["std"]
    ys = (hy - prep.label_mean) / prep.label_std
    best = float(xs @ ys / (xs @ xs))
    twin = checkpoint(best + 0.99 * (best - 1.3 / scale))  # a hair closer to it than the challenger, the other side
    noisy = promote.gate(loose, holdout, twin, _register(cfg, twin))
    assert noisy.decision == "not_promoted" and "within the holdout's noise" in noisy.reason, noisy.reason


def test_register_is_idempotent_across_task_retries(tmp_path):
    """The register task run twice in one flow run (a retry after a failure past the registration) gives one MLflow
    run and one model version."""
    from prefect import flow

    from trainflow.tasks.values import Ingested, Selected, TrainOutcome
    from trainflow.tasks.register import register
    from trainflow.tables.files import TableSpec

    cfg, _, checkpoint = _gate_setup(tmp_path)
    spec = TableSpec(
        path=str(tmp_path / "t.parquet"),
        files=[],
        label="y",
        id_column=None,
        numeric=["x"],
        feature_order=["x"],
        fingerprint="content:abc",
        mlflow_types={"x": "double"},
    )
    outcome = TrainOutcome(
        run_name="r1",
        family="mlp",
        run_path=str(tmp_path / "runs" / "r1"),
        checkpoints=[],
        history=[{"epoch": 0, "train_loss": 1.0, "val_loss": 0.9}],
    )
    selected = Selected(path=checkpoint(1.0), epoch=0, metrics={"val_loss": 0.9}, skipped=[])

    @flow
    def twice():
        return register(cfg, Ingested(None, spec), outcome, selected), register(
            cfg, Ingested(None, spec), outcome, selected
        )

    first, second = twice()
    assert (first.run_id, first.model_version) == (second.run_id, second.model_version) == (first.run_id, "1")
    client = mlflow.MlflowClient(tracking_uri=cfg.mlflow.tracking_uri)
    assert len(client.search_model_versions("name = 'gate'")) == 1
    assert len(client.get_metric_history(first.run_id, "val_loss")) == 1


def test_a_version_registered_before_keeps_the_budget_it_was_trained_under(tmp_path):
    """A resumed retrain with more epochs that chooses an earlier retrain's checkpoint again reports into that
    version's run: the budget params it has stay (MLflow refuses a changed param), new ones are added."""
    from trainflow.tasks.report import new_params

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("budget")).info.run_id
    client.log_batch(run_id, params=new_params(client, run_id, {"epochs": 5, "limit": 5}, "budget."))
    client.log_batch(run_id, params=new_params(client, run_id, {"epochs": 6, "limit": 6, "unit": "epoch"}, "budget."))
    assert client.get_run(run_id).data.params == {"budget.epochs": "5", "budget.limit": "5", "budget.unit": "epoch"}


def test_a_full_disk_is_one_clear_error_and_never_retried(capsys, monkeypatch):
    import errno

    import trainflow.flows.cli as cli
    import trainflow.flows.cli.app as cli_main_module
    from trainflow.tasks.common import retry_unless_user_error

    full = OSError(errno.ENOSPC, "No space left on device", "/data/runs/x")

    class State:
        def result(self):
            raise RuntimeError("write failed") from full

    assert retry_unless_user_error(None, None, State()) is False

    def run(args):
        raise RuntimeError("Ray task failed") from full

    monkeypatch.setattr(cli_main_module, "run_command", run)
    assert cli.main(["retrain", "--config", "x.yaml"]) == 2
    assert "no space left on device" in capsys.readouterr().err


def test_dataset_inputs_never_carry_credentials_of_the_table_uri(tmp_path):
    # the MLflow run's dataset inputs name the table by its URI: user-info and credential query values masked,
    # in the source and in the dataset's name
    from trainflow.tables.files import TableSpec
    from trainflow.tasks.values import Ingested
    from trainflow.tasks.register import log_datasets

    uri = "s3://AKIAUSER:pa55-s3cret@bucket/tables/train.parquet?X-Amz-Signature=sig-s3cret&versionId=7"
    cfg = config_from_dict(
        {
            "data": {"path": uri, "label": "y"},
            "task": "regression",
            "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        },
        base_dir=tmp_path,
    )
    spec = TableSpec(path=uri, files=[], label="y", id_column=None, fingerprint="content:" + "ab" * 16)
    with tracking(cfg.mlflow.tracking_uri), mlflow.start_run() as run:
        log_datasets(cfg, Ingested(None, spec))
    inputs = mlflow.MlflowClient(tracking_uri=cfg.mlflow.tracking_uri).get_run(run.info.run_id).inputs.dataset_inputs
    assert len(inputs) == 2
    for i in inputs:
        text = json.dumps([i.dataset.name, i.dataset.source, i.dataset.digest])
        assert "s3cret" not in text and "AKIAUSER" not in text and "bucket/tables/train.parquet" in text, text
        assert i.dataset.name.startswith("train.parquet (")


def test_the_gate_judges_only_rows_held_out_from_both_models(tmp_path):
    """A champion trained under another seed held out other rows: only the rows neither model trained or chose on
    count, their number is stated, and too few of them means no promotion on that evidence."""
    import trainflow.tasks.promote as promote

    cfg, holdout, checkpoint = _gate_setup(tmp_path)
    table = pa.concat_tables(ray.get(holdout.to_arrow_refs()))
    champion_plan = FoldPlan(seed=1, key_columns=("x", "y"), test_fraction=0.5, validation_fraction=0.2)
    weak = checkpoint(0.5, seed=1)
    promote.gate(cfg, holdout, weak, _register(cfg, weak))
    held = int(champion_plan.held_out(table).sum())
    assert 50 < held < 150
    # a better challenger, but fewer rows held out from both than promotion.min_test_rows: no promotion
    picky = cfg.model_copy(update={"promotion": cfg.promotion.model_copy(update={"min_test_rows": held + 1})})
    refused = promote.gate(picky, holdout, checkpoint(1.0), _register(cfg, checkpoint(1.0)))
    assert (refused.decision, refused.rows) == ("not_promoted", held)
    assert f"only {held} test rows are held out from both" in refused.reason and "seed 1" in refused.reason
    strong = promote.gate(cfg, holdout, checkpoint(1.0), _register(cfg, checkpoint(1.0)))
    assert (strong.decision, strong.judged_on, strong.rows) == ("promoted", "test", held)
    assert strong.challenger_score < strong.champion_score  # val_loss, on the same held-out rows


def test_a_champion_whose_stored_split_plan_was_edited_is_no_evidence(tmp_path):
    """The registered champion's split.json edited after the fact (seed 0 -> 7: other rows look held out) no longer
    matches its own config.json: the gate does not promote on that evidence, and says why."""
    import trainflow.tasks.promote as promote

    cfg, holdout, checkpoint = _gate_setup(tmp_path)
    weak = checkpoint(0.5)
    promote.gate(cfg, holdout, weak, _register(cfg, weak))
    edited = json.loads((Path(weak) / "split.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=cfg.mlflow.tracking_uri)
    stored = Path(client.get_model_version_download_uri("gate", "1").removeprefix("file://"))
    [plan_file] = stored.rglob("split.json")  # the registered artifact itself, not a downloaded copy
    plan_file.write_text(json.dumps({**edited, "seed": 7}))
    strong = checkpoint(1.0)
    refused = promote.gate(cfg, holdout, strong, _register(cfg, strong))
    assert refused.decision == "not_promoted" and _champion(cfg) == "1"
    assert "stored split plan (split.json) does not match its own training" in refused.reason
    assert "seed 7 where its config says split.seed 0" in refused.reason
    tags = client.get_model_version("gate", "2").tags
    assert tags["trainflow.promotion.judged_rows"] == str(refused.rows)
    assert tags["trainflow.promotion.challenger_score"] == str(refused.challenger_score)


def test_a_drift_event_never_carries_the_credentials_of_the_scoring_uri(tmp_path):
    """The scoring table's URI with user-info (a secret) goes into the drift event's payload and the artifact's
    description masked, as into the logs."""
    import datetime

    from prefect import flow

    from tests.conftest import prefect_events
    from trainflow.tasks.drift import DRIFT_EVENT, publish

    cfg = config_from_dict(
        {
            "data": {"path": "x", "label": "y"},
            "task": "classification",
            "mlflow": {"registered_model": "redacted-test"},
        },
        base_dir=tmp_path,
    )
    since = datetime.datetime.now(datetime.timezone.utc)
    flow(name="drift-redaction")(publish)(
        cfg,
        "models:/redacted-test/1",
        "s3://AKIAUSER:hunter2secret@bucket/t.parquet",
        {},
        estimated_drop={"val_roc_auc": 0.2},
    )
    [event] = prefect_events(DRIFT_EVENT, since)
    assert "hunter2secret" not in json.dumps(event.payload) and event.payload["input"].endswith("@bucket/t.parquet")
