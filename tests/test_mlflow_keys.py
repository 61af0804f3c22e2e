"""Names built from data become keys MLflow takes, distinct for distinct originals; a config's params are all
recorded (or the refused ones named); after the alias moved, nothing MLflow refuses can fail the gate. Real MLflow
on SQLite."""

from __future__ import annotations

import logging

import mlflow
import pytest
from mlflow.entities import Metric, Param

from trainflow.config import config_from_dict
from trainflow.run.tracking import flatten, mlflow_key

AWKWARD = [
    "slice.site.http://a.example/.val_loss",
    "importance.speed km/h/",
    "train.class_weight.<=50K",
    "drift.churn 😀",
    "x/../y",
    "/lead",
    "a:b",
    "a" * 300,
    "importance.[x](javascript:alert(1))",
]


@pytest.fixture
def client(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = mlflow.MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("keys", artifact_location=str(tmp_path / "art"))
    return uri, c, c.create_run(exp).info.run_id


def test_keys_from_data_are_accepted_and_stay_distinct(client):
    _, c, run_id = client
    keys = [mlflow_key(k) for k in AWKWARD]
    assert len(set(keys)) == len(keys)
    assert mlflow_key("a_b") == "a_b" and mlflow_key("a:b") != "a_b"  # a valid key is kept; a changed one is marked
    c.log_batch(run_id, metrics=[Metric(k, 1.0, 0, 0) for k in keys], params=[Param(k, "v") for k in keys])
    logged = c.get_run(run_id).data
    assert set(logged.metrics) == set(keys) and set(logged.params) == set(keys)


def test_every_config_param_is_recorded_with_class_weights_keyed_by_odd_labels(client, tmp_path):
    from trainflow.tasks.mlflow_run import log_params

    uri, c, run_id = client
    cfg = config_from_dict(
        {
            "data": {"path": "mem", "label": "income"},
            "task": "classification",
            "model": {"type": "mlp"},
            "train": {"class_weight": {"<=50K": 1.0, ">50K": 3.0}},
        },
        base_dir=tmp_path,
    )
    log_params(uri, run_id, cfg, "mlp")
    params = c.get_run(run_id).data.params
    assert len(params) == len(flatten(cfg.for_family("mlp").to_dict())) > 50
    assert {v for k, v in params.items() if k.startswith("train.class_weight.")} == {"1.0", "3.0"}


def test_after_the_alias_moved_a_record_mlflow_refuses_is_a_warning_not_a_failure(client, caplog):
    from trainflow.tasks.promote import PROMOTED, evaluation_metrics, record_decision
    from trainflow.tasks.values import Promotion

    uri, c, run_id = client

    class Refusing:
        def __getattr__(self, name):
            def refuse(*args, **kwargs):
                raise mlflow.exceptions.MlflowException("INVALID_PARAMETER_VALUE: refused")

            return refuse

    result = Promotion(
        decision=PROMOTED,
        reason="first model",
        metric="val_loss",
        mode="min",
        margin=0.0,
        min_score=None,
        below_floor=False,
        model_name="m",
        challenger_version="1",
        challenger_score=0.5,
        champion_version=None,
        champion_score=None,
        serving_version="1",
        serving_checkpoint="x",
        slices={"site": {"http://a.example/": {"val_loss": 0.4}}},
    )
    caplog.set_level(logging.WARNING)
    record_decision(Refusing(), result, run_id, {"trainflow.promotion.decision": PROMOTED})
    assert sum("the decision stands" in r.getMessage() for r in caplog.records) == 2
    # with a real store the slice metric of an awkward value is recorded
    record_decision_metrics = [m.key for m in evaluation_metrics(result)]
    c.log_batch(run_id, metrics=[Metric(k, 0.4, 0, 0) for k in record_decision_metrics])
    assert set(record_decision_metrics) <= set(c.get_run(run_id).data.metrics)


def test_a_new_sqlite_store_is_created_whole_even_by_a_process_killed_during_its_migrations(tmp_path):
    """MLflow migrating a new store in place, killed halfway, left a store every later open failed on ("duplicate
    column name"); prepare_store migrates it in a staging folder and gives it the store's name only when whole."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from trainflow.run.tracking import ensure_experiment, prepare_store, tracking

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    code = f"from trainflow.run.tracking import prepare_store; prepare_store({uri!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path)
    staging = f".mlflow.db.tmp-*-{proc.pid}-*"  # storage.staging_folder's
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(f"{staging}/mlflow.db")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # inside MLflow's migrations
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not db.exists(), "a store was named before its migrations finished"
    with tracking(uri):  # the next run: a whole store, the killed one's staging files removed
        assert ensure_experiment(uri, "after-a-kill")
    assert db.exists() and not list(tmp_path.glob(".mlflow.db.tmp-*"))
    # an existing store, or a file of the user's under that name, is left as it is
    before = db.read_bytes()
    prepare_store(uri)
    assert db.read_bytes() == before
    mine = tmp_path / "notes.db"
    mine.write_text("not MLflow's")
    prepare_store(f"sqlite:///{mine}")
    assert mine.read_text() == "not MLflow's"
