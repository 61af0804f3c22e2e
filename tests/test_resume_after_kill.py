"""The flow's own process is sent SIGTERM (a cancel), then SIGKILLed, each after a checkpoint; a rerun with the
same name resumes each time."""

import contextlib
import json
import os
import signal
import subprocess
import sys

import pyarrow.dataset as pads
import pytest

from tests.conftest import churn_config, write_parquet
from tests.faults import wait_registered
from trainflow.trainer.checkpoint import read_metrics
from trainflow.trainer.recovery import read_events
from trainflow.trainer.runner import checkpoints_on_disk
from trainflow.flows.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]
EPOCHS = 8  # long enough that both stops land mid-run, even when the killed workers run on a while


def _start(cfg, env):
    return subprocess.Popen(
        [sys.executable, "-m", "trainflow.flows.cli", "retrain", "--config", str(cfg), "--run-name", "killed-run"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def _done(run) -> int:
    return max(read_metrics(d)["epoch"] for d in run.glob("checkpoint_*") if (d / "metrics.json").exists())


def test_rerun_with_same_name_resumes_after_sigterm_then_sigkill(tmp_path, capsys):
    # one run stopped twice: a cancel (SIGTERM) after its first checkpoint, then its rerun SIGKILLed after a
    # later one; the third start finishes, each start resuming where the one before stopped
    cfg = churn_config(tmp_path, rows=6000, train={"epochs": EPOCHS, "batch_size": 32},
                       checkpoint={"min_interval_s": 0})  # a checkpoint per epoch, however fast the epochs
    run = tmp_path / "runs" / "killed-run"
    from prefect.settings import PREFECT_API_URL

    # the killed flows report to the session's test server instead of starting a temporary one of their own
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PREFECT_API_URL": PREFECT_API_URL.value()}
    stops = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        after = _done(run) + 1 if stops else 0
        proc = _start(cfg, env)
        try:
            # stop as soon as Ray's controller has registered a new checkpoint (what a rerun resumes from)
            wait_registered(run, after, timeout_s=300, alive=lambda: proc.poll() is None)
            if sig == signal.SIGTERM:
                # what Prefect sends to cancel: the CLI stops Ray at once, even with its main thread inside the
                # fit, and retries nothing (before, the signal surfaced as a SystemError that the train task
                # retried). Its exit status is 143 from a shell with Prefect's temporary server; under this
                # test's external Prefect API the process ends with SIGABRT after printing its stop message
                # (Ray's C-level SIGTERM handler, not resolved), so only the end of the process is asserted.
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):  # after SIGTERM the whole group may have ended already
                os.killpg(proc.pid, signal.SIGKILL)  # the flow process and the local Ray it started (SIGKILL case)
            proc.wait()
        stops.append(_done(run))
    assert stops[0] < stops[1] < EPOCHS - 1, f"checkpoints at the stops: {stops}"

    summary_path = tmp_path / "summary.json"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "killed-run", "--summary-json", str(summary_path)]) == 0
    summary = json.loads(summary_path.read_text())
    # Ray resumes from the latest checkpoint its controller registered; the stopped run's workers may still
    # have registered one or two more before Ray noticed their driver was gone
    assert stops[1] <= summary["resumed_from_epoch"] < EPOCHS
    # the reruns trained only the remaining epochs: every epoch once in the final history, and each start's
    # workers began at the epoch it resumed from (the best checkpoint may be an earlier one, so read the last)
    last = checkpoints_on_disk(summary["ray_run_path"])[-1]
    assert [h["epoch"] for h in read_metrics(last["path"])["history"]] == list(range(EPOCHS))
    starts = sorted(e["from_epoch"] for e in read_events(summary["ray_run_path"]) if e["event"] == "worker_start")
    assert starts[:2] == [0, 0] and starts[-2:] == [summary["resumed_from_epoch"]] * 2 and len(starts) == 6
    assert 1 <= starts[2] == starts[3] <= stops[1]
    assert any(r["resumed_from_epoch"] == summary["resumed_from_epoch"] for r in summary["recoveries"])
    # MLflow: the SIGKILLed start's parent run and the family run nested in it, left RUNNING by the dead process,
    # were ended KILLED by the rerun, saying why; nothing of this retrain is RUNNING any more
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == [], [
        (r.info.run_id, r.info.run_name, r.info.status, r.data.tags.get("trainflow.process"),
         r.data.tags.get("mlflow.parentRunId"), r.data.tags.get("trainflow.register_key")) for r in runs]
    ended = [r for r in runs if "trainflow.ended_by" in r.data.tags]
    assert ended and all(r.info.status == "KILLED" and "ended without ending this run" in r.data.tags["trainflow.ended_by"]
                         for r in ended)
    assert {r.info.run_name for r in ended} >= {"killed-run"}

    # the same run name onto other data (100 rows fewer) or another training config fails before any training,
    # naming both fingerprints; the checkpoints stay as they were
    kept = sorted(p.name for p in run.glob("checkpoint_*"))
    table = pads.dataset(tmp_path / "data" / "train.parquet").to_table()
    write_parquet(table.slice(0, table.num_rows - 100), tmp_path / "data" / "train.parquet")
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "killed-run"]) == 2
    err = capsys.readouterr().err
    assert "the data changed" in err and summary["data_fingerprint"] in err and "another --run-name" in err
    write_parquet(table, tmp_path / "data" / "train.parquet")
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "killed-run", "--set", "train.learning_rate=0.5"]) == 2
    assert "the training config changed" in capsys.readouterr().err
    assert sorted(p.name for p in run.glob("checkpoint_*")) == kept
