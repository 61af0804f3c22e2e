"""Ray's retries exhausted: the Prefect task retry resumes the same run; all retries exhausted: Failed, nothing lost."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from mlflow import MlflowClient

from tests.conftest import churn_config
from tests.faults import checkpoint_registered, train_worker_pids
from trainflow.trainer.serving.checkpoint import read_metrics
from trainflow.flows.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]


class WorkerKiller(threading.Thread):
    """SIGKILLs the Ray Train workers: once after the run's first checkpoint, or every time they start."""

    def __init__(self, run: Path, always: bool):
        import ray

        super().__init__(daemon=True)
        self.run_path, self.always, self.kills = run, always, 0
        self.done = threading.Event()
        self.address = ray.get_runtime_context().gcs_address  # this test's Ray only
        self.killed: set[int] = set()

    def run(self) -> None:
        while not self.done.wait(0.3):
            if not self.always and not checkpoint_registered(self.run_path):
                continue
            pids = [p for p in train_worker_pids(self.address) if p not in self.killed]
            for pid in pids:
                self.killed.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if pids:
                self.kills += 1
                if not self.always:
                    return


def test_prefect_retry_resumes_then_exhausted_retries_fail_cleanly(tmp_path, capsys):
    # max_failures=0: the first dead worker fails the Ray Train run, so only the Prefect retry can save it
    cfg = churn_config(
        tmp_path,
        rows=6000,
        network={"epochs": 4, "batch_size": 64},
        failure={"max_failures": 0, "task_retries": 1, "retry_delay_s": 1},
        checkpoint={"min_interval_s": 0},  # a checkpoint per epoch, however fast the epochs
        scaling={"num_workers": 1, "local_mode": False},  # a Ray Train worker to kill
    )
    run = tmp_path / "runs" / "retried"
    killer = WorkerKiller(run, always=False)
    killer.start()
    try:
        rc = cli_main(
            ["retrain", "--config", str(cfg), "--run-name", "retried", "--summary-json", str(tmp_path / "s.json")]
        )
    finally:
        killer.done.set()
    assert rc == 0 and killer.kills == 1
    summary = json.loads((tmp_path / "s.json").read_text())
    # the retry resumed the same run from a checkpoint instead of starting over
    assert summary["ray_run_path"] == str(run)
    assert summary["resumed_from_epoch"] >= 1
    [recovery] = summary["recoveries"]
    assert recovery["resumed_from_epoch"] == summary["resumed_from_epoch"]
    assert summary["epochs_run"] == 4  # epochs 0..3, the ones before the kill not repeated
    history = read_metrics(summary["best_checkpoint"]["path"])["history"]
    assert [h["epoch"] for h in history] == list(range(summary["best_checkpoint"]["epoch"] + 1))
    predictions = Path(summary["predictions_path"])
    before = {p.name: p.read_bytes() for p in predictions.iterdir()}

    # every attempt loses its workers: Ray gives up, the Prefect retry gives up, the flow fails
    killer = WorkerKiller(tmp_path / "runs" / "doomed", always=True)
    killer.start()
    capsys.readouterr()
    try:
        # (--force: the same data and config as the champion would otherwise skip the run)
        rc = cli_main(["retrain", "--config", str(cfg), "--run-name", "doomed", "--force"])
    finally:
        killer.done.set()
    err = capsys.readouterr().err
    assert rc == 1
    assert "trainflow: failed:" in err and "Traceback" not in err
    assert killer.kills >= 2  # the first attempt and the Prefect retry
    # no model version for the failed run; the earlier predictions are byte-for-byte intact
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [str(v.version) for v in client.search_model_versions("name='churn-test'")] == ["1"]
    assert {p.name: p.read_bytes() for p in predictions.iterdir()} == before
    assert pads.dataset(predictions).count_rows() == summary["output_rows"]
    assert not [p for p in predictions.parent.iterdir() if ".tmp-" in p.name]
