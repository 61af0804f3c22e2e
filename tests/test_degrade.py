"""One family's failure never throws away the others: LightGBM's Ray Train workers are SIGKILLed whenever they
appear, its retries run out, and the run goes on with the network, says why LightGBM is missing and exits 0."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from tests.conftest import churn_config
from tests.faults import train_worker_pids
from trainflow.flows.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]


def _kill_train_workers_once(ready, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL every Ray Train worker process that appears once ready() is true, until stop is set."""
    import ray

    address = ray.get_runtime_context().gcs_address  # this test's Ray, whatever else runs on the machine
    while not stop.is_set():
        if ready():
            for pid in train_worker_pids(address):
                if pid not in killed:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
        stop.wait(0.2)


def test_a_family_whose_workers_keep_dying_is_left_out_and_the_others_go_on(tmp_path, capsys):
    cfg = churn_config(
        tmp_path,
        rows=1500,
        model={"type": ["mlp", "lightgbm"]},
        train={"epochs": 2},
        failure={"max_failures": 0, "task_retries": 0},
        scaling={"num_workers": 2},
    )  # a worker group fills the cluster: LightGBM starts after the network
    network_done = tmp_path / "runs" / "deg-mlp" / "trainflow_finished.json"
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_train_workers_once, args=(network_done.exists, stop, killed), daemon=True)
    killer.start()
    try:
        rc = cli_main(
            ["retrain", "--config", str(cfg), "--run-name", "deg", "--summary-json", str(tmp_path / "s.json")]
        )
    finally:
        stop.set()
        killer.join(10)
    assert killed, "no LightGBM worker was seen to kill"
    assert rc == 0
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["model_family"] == "mlp" and s["model_version"] == "1" and s["output_rows"] == 500
    assert (
        list(s["families_failed"]) == ["lightgbm"]
        and "deg-lightgbm failed (Prefect retries: 0)" in s["families_failed"]["lightgbm"]
    )
    assert s["candidates"] is None and s["test_metrics"]["test_loss"] > 0
    assert "lightgbm   failed, left out (the other families went on)" in capsys.readouterr().out
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {
        r.info.run_name: r.info.status
        for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
    }
    assert runs["deg-lightgbm"] == "FAILED"  # the family left out says so in MLflow
    assert runs["deg-mlp"] == "FINISHED"  # the family that trained and won ends with the retrain
