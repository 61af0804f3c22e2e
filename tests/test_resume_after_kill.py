"""The flow's own process is SIGKILLed after its first checkpoint; a rerun with the same name resumes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import churn_config
from trainer.checkpoint import read_metrics
from trainflow.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness")]


def test_rerun_with_same_name_resumes_after_sigkill(tmp_path):
    cfg = churn_config(tmp_path, rows=6000, train={"epochs": 4, "batch_size": 32})
    run = tmp_path / "runs" / "killed-run"
    from prefect.settings import PREFECT_API_URL

    # the killed flow reports to the session's test server instead of starting a temporary one of its own
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainflow.cli", "retrain", "--config", str(cfg), "--run-name", "killed-run"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not list(run.glob("checkpoint_*/metrics.json")):
            assert proc.poll() is None, "the flow ended before it could be killed"
            time.sleep(0.5)
        assert list(run.glob("checkpoint_*/metrics.json")), "no checkpoint within 300 s"
        time.sleep(2)  # let Ray's controller register the checkpoint it just uploaded, as it would mid-epoch
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the flow process and the local Ray it started
        proc.wait()
    done_before = max(read_metrics(d)["epoch"] for d in run.glob("checkpoint_*") if (d / "metrics.json").exists())
    assert done_before < 3, "the whole run finished before the kill"

    import ray

    from trainflow.runtime import configure_ray_data

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    configure_ray_data()
    try:
        summary_path = tmp_path / "summary.json"
        assert cli_main(["retrain", "--config", str(cfg), "--run-name", "killed-run", "--summary-json", str(summary_path)]) == 0
    finally:
        ray.shutdown()
    summary = json.loads(summary_path.read_text())
    assert summary["resumed_from_epoch"] >= 1
    # Ray resumes from the latest checkpoint its controller registered: the last one on disk, or the one before
    assert summary["resumed_from_epoch"] in (done_before, done_before + 1)
    history = read_metrics(summary["best_checkpoint"]["path"])["history"]
    assert [h["epoch"] for h in history][: summary["resumed_from_epoch"]] == list(range(summary["resumed_from_epoch"]))
    assert any(r["resumed_from_epoch"] == summary["resumed_from_epoch"] for r in summary["recoveries"])
