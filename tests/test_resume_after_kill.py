"""Exactly once: one retrain SIGKILLed at every step boundary where something durable changes, in turn
(mid-training, in Ray Train's local mode as a small table trains: the process holds the fit, in the ensemble task after training and selection, after the refit's fit and before its registration, inside the gate with the champion lock held and
the model version registered, between the alias move and its record, and while the predictions are committed); each
rerun with the same name resumes where the one before stopped, and the last one ends with one model version, one
alias move, one complete output and no MLflow run left RUNNING. (A kill after ingest leaves nothing durable, as before
the mid-training start; one after training leaves what the ensemble task's kill leaves, less its staging folder; one
right after register leaves what the gate's kill leaves, less the lock: each would be one more fresh process, about
13 s, for a state the chain already meets.)"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from tests.conftest import churn_config, write_parquet
from trainflow.trainer.serving.checkpoint import read_metrics
from trainflow.trainer.recovery import read_events
from trainflow.trainer.runner import checkpoint_folders, checkpoints_on_disk
from trainflow.flows.cli import main as cli_main
from trainflow.run.locks import lock_name
from trainflow.tables.outputs import MANIFEST, read_manifest, write_output

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness")]
EPOCHS = 10  # long enough that the stop lands mid-run
REPO = Path(__file__).resolve().parents[1]
# the boundaries after training, in the order a retrain reaches them (tests/kill_at.py)
# (after training, after selection and before the ensemble's weights nothing durable changes: one kill, in the
# ensemble task, covers the three; the gate's kill comes after register, with the version registered)
AFTER_TRAINING = ("ensemble-build", "refit-fitted", "promote-locked", "promote-moved", "output-commit")


def _start(cfg, env, log, kill_at=None):
    args = ["-m", "tests.kill_at", kill_at] if kill_at else ["-m", "trainflow.flows.cli"]
    return subprocess.Popen(
        [sys.executable, *args, "retrain", "--config", str(cfg), "--run-name", "killed-run"],
        env=env,
        cwd=REPO,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc) -> None:
    with contextlib.suppress(ProcessLookupError):  # the flow process may have ended its group already
        os.killpg(proc.pid, signal.SIGKILL)  # the flow process and what it started (its temporary Prefect server)
    proc.wait()


def _newest(run: Path) -> int:
    """The newest epoch of the run's complete checkpoints on disk (what a local fit's rerun resumes from)."""
    return checkpoints_on_disk(str(run))[-1]["epoch"]


def test_a_retrain_killed_at_every_step_boundary_ends_exactly_once(tmp_path, capsys, prefect_home):
    cfg = churn_config(
        tmp_path,
        rows=6000,
        model={"type": ["mlp", "xgboost"], "params": {"num_boost_round": 30}},
        network={"epochs": EPOCHS, "batch_size": 32},  # two families: an ensemble too
        scaling={"num_workers": 1},  # one worker group start less per run: DDP is not under test
        checkpoint={"min_interval_s": 0},
    )  # a checkpoint per epoch, however fast the epochs
    runs = tmp_path / "runs"
    # one split of 6,000 rows, one worker each: both families train in one Ray Train run (tasks/cross_fit.py
    # train_config) in local mode (the CLI's process; no Ray starts), the network in its folder of it
    shared = runs / "killed-run-families"
    run = shared / "killed-run-mlp" / "fold0"
    refit = shared / "killed-run-xgboost" / "refit"  # train.refit auto: the booster (alone or in the ensemble)
    output = tmp_path / "out" / "predictions"
    home = prefect_home
    # local runs as a user starts them (Prefect's temporary server, file locks under its home; a small table: no Ray)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    env.update(PYTHONUNBUFFERED="1", PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    logs = iter(tmp_path / f"start-{i}.log" for i in range(20))

    def killed_at(boundary):
        log = next(logs)
        proc = _start(cfg, env, log, boundary)
        try:
            code = proc.wait(timeout=300)
        finally:
            _stop(proc)
        assert code == -signal.SIGKILL, f"{boundary}: exit {code}, not killed there:\n{log.read_text()[-4000:]}"

    # mid-training: SIGKILLed once the network's first checkpoint is whole on disk (what a rerun resumes from: the
    # newest whole one; a worker group's kill and restart are tests/test_faults.py's, a cancel's SIGTERM
    # mid-training tests/test_deployments.py's)
    proc = _start(cfg, env, next(logs))
    try:
        give_up = time.monotonic() + 300
        while not checkpoints_on_disk(str(run)):
            assert proc.poll() is None and time.monotonic() < give_up, f"no whole checkpoint under {run}"
            time.sleep(0.05)
    finally:
        _stop(proc)
    stopped = _newest(run)
    assert stopped < EPOCHS - 1, f"the checkpoint at the stop: {stopped}"

    # an earlier trainflow output where the predictions go: the kill during the commit must leave it whole
    earlier = pa.table({"customer_id": [1, 2], "prediction": [0, 1]})
    write_output(earlier, str(output), 2, {"model": "an earlier run"})
    before = {p.name: p.read_bytes() for p in output.iterdir()}
    model = "churn-test"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    for boundary in AFTER_TRAINING:
        killed_at(boundary)
        registered = boundary not in ("ensemble-build", "refit-fitted")
        versions = client.search_model_versions(f"name = '{model}'") if registered else []
        aliases = client.get_registered_model(model).aliases if versions else {}
        if boundary == "ensemble-build":  # both families trained to the end: no rerun trains them again
            assert all(
                (shared / f"killed-run-{f}" / "fold0" / "trainflow_finished.json").exists() for f in ("mlp", "xgboost")
            )
        elif boundary == "refit-fitted":  # the chosen booster refitted to its end, nothing registered
            assert (refit / "trainflow_finished.json").exists() and not client.search_registered_models()
            refitted = checkpoint_folders(str(refit))
        elif boundary == "promote-locked":  # registered, not judged; the kill freed the champion lock at once
            assert len(versions) == 1 and not aliases
            _assert_free(home, lock_name("champion", model, f"sqlite:///{tmp_path / 'mlflow.db'}"))
        elif boundary == "promote-moved":  # the alias moved; the killed run never recorded the move
            assert len(versions) == 1 and aliases == {"champion": 1}
            assert "trainflow.champion.periods" not in versions[0].tags
        elif boundary == "output-commit":  # the earlier output untouched; the staged one hidden beside it
            assert {p.name: p.read_bytes() for p in output.iterdir()} == before
            assert read_manifest(str(output))["model"] == "an earlier run"

    summary_path = tmp_path / "summary.json"
    assert (
        cli_main(["retrain", "--config", str(cfg), "--run-name", "killed-run", "--summary-json", str(summary_path)])
        == 0
    )
    summary = json.loads(summary_path.read_text())
    # one model version for this training, @champion, moved once (the rerun recorded the move the killed run made)
    # (the champion's own data and config, but the retrain that registered it never finished: this one does, and
    # the one after it has nothing to train)
    assert summary["model_version"] == "1" and summary["promotion"]["serving_version"] == "1"
    [version] = client.search_model_versions(f"name = '{model}'")
    version = client.get_model_version(model, version.version)
    assert client.get_registered_model(model).aliases == {"champion": 1}
    from trainflow.champion import history

    [period] = history(client, model)
    assert period["version"] == "1" and period["until"] is None and "recorded by a rerun" in period["why"], period
    assert version.tags["trainflow.promotion.decision"] == "promoted" and "Gate: promoted" in version.description
    # one complete output, the earlier one replaced whole, nothing staged left beside it
    manifest = read_manifest(str(output))
    assert manifest["rows"] == 500 == pads.dataset(output, format="parquet").to_table().num_rows
    assert [p.name for p in output.parent.iterdir()] == ["predictions"] and (output / MANIFEST).exists()
    assert not list(runs.glob("*/.*.tmp-*"))  # no staging folder of a checkpoint bundle left (tests/test_ensemble.py)

    # the refit the killed process finished was not trained again: the served model is it
    assert summary["refit"]["refitted"] and checkpoint_folders(str(refit)) == refitted
    assert [m["run"] for m in summary["refit"]["members"]] == ["killed-run-families/killed-run-xgboost/refit"]
    # the rerun resumed from the newest whole checkpoint the killed process left: the epoch after it
    mlp = json.loads((run / "trainflow_finished.json").read_text())["outcome"]
    assert mlp["resumed_from_epoch"] == stopped + 1
    # the rerun trained only the remaining epochs: every epoch once in the final history, and each start's
    # worker began at the epoch it resumed from (the best checkpoint may be an earlier one, so read the last)
    last = checkpoints_on_disk(str(run))[-1]
    assert [h["epoch"] for h in read_metrics(last["path"])["history"]] == list(range(EPOCHS))
    starts = [e["from_epoch"] for e in read_events(str(run)) if e["event"] == "worker_start"]
    assert starts == [0, mlp["resumed_from_epoch"]], starts
    # no checkpoint folder beside the whole ones (a killed attempt's last one, cut short, was removed by the rerun)
    assert checkpoint_folders(str(run)) == {Path(c["path"]).name for c in checkpoints_on_disk(str(run))}
    # MLflow: every killed start's runs (the parent, the families', the ensemble's), left RUNNING by the dead
    # process, were ended KILLED by the rerun, saying why; nothing of this retrain is RUNNING any more
    runs_ = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert [r.info.run_name for r in runs_ if r.info.status == "RUNNING"] == [], [
        (
            r.info.run_id,
            r.info.run_name,
            r.info.status,
            r.data.tags.get("trainflow.process"),
            r.data.tags.get("mlflow.parentRunId"),
            r.data.tags.get("trainflow.register_key"),
        )
        for r in runs_
    ]
    ended = [r for r in runs_ if "trainflow.ended_by" in r.data.tags]
    assert ended and all(
        r.info.status == "KILLED" and "ended without ending this run" in r.data.tags["trainflow.ended_by"]
        for r in ended
    )
    assert {r.info.run_name for r in ended} >= {"killed-run"}

    assert (
        cli_main(["retrain", "--config", str(cfg), "--run-name", "killed-run", "--summary-json", str(summary_path)])
        == 0
    )
    assert json.loads(summary_path.read_text())["skipped"]["champion_version"] == "1"

    # the same run name onto other data (100 rows fewer) or another training config fails before any training,
    # naming both fingerprints; the checkpoints stay as they were
    kept = sorted(p.name for p in run.glob("checkpoint_*"))
    table = pads.dataset(tmp_path / "data" / "train.parquet").to_table()
    write_parquet(table.slice(0, table.num_rows - 100), tmp_path / "data" / "train.parquet")
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "killed-run"]) == 2
    err = capsys.readouterr().err
    assert "the data changed" in err and summary["data_fingerprint"] in err and "another --run-name" in err
    write_parquet(table, tmp_path / "data" / "train.parquet")
    assert (
        cli_main(
            ["retrain", "--config", str(cfg), "--run-name", "killed-run", "--set", "model.params.mlp.learning_rate=0.5"]
        )
        == 2
    )
    assert "the training config changed" in capsys.readouterr().err
    assert sorted(p.name for p in run.glob("checkpoint_*")) == kept


def _assert_free(home: Path, name: str) -> None:
    """The file lock `name` under the Prefect home can be taken at once (no process holds it)."""
    import fcntl

    path = home / "trainflow-locks" / f"{name}.lock"
    assert path.exists(), f"the run never took the lock {path}"
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if a living process held it
    finally:
        os.close(fd)
