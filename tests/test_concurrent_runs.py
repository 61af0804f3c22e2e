"""Two `trainflow retrain` processes with one --run-name started at the same moment, each with its own local Ray and
temporary Prefect server, as two nightly jobs would: one trains and publishes, the other waits for the run lock and
then finds that run finished (one version, one parent MLflow run, one predictions write); both temporary servers come
up (their starts take turns), none is left running; a secret in scaling.env_vars is in no file the runs leave, their
Ray sessions included. Then the temporary server's own start: one that fails stops its process, and a SIGTERM during
a CLI's start-up leaves no server behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import churn_config

pytestmark = [pytest.mark.e2e]
REPO = Path(__file__).resolve().parents[1]
SENTINEL = "tok-3c9a7e1d-sentinel"


def _env(home: Path) -> dict[str, str]:
    """A local run as a user starts it: Prefect's temporary server and file locks under its own home, its own Ray."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "RAY_ADDRESS"))}
    env.update(PYTHONUNBUFFERED="1", PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return env


def _children(pid: int, name: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = (
        Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] if Path(f"/proc/{pid}/stat").exists() else "X"
    )
    return state not in ("Z", "X")


def test_two_retrains_of_one_run_name_at_once_publish_once(tmp_path, prefect_home):
    home = prefect_home
    # ray.temp_dir: kept, to be searched (short: Ray's socket paths under it must fit 107 characters)
    sessions = Path(tempfile.mkdtemp(prefix="tfr", dir="/tmp"))
    try:
        _two_at_once(tmp_path, home, sessions)
    finally:
        shutil.rmtree(sessions, ignore_errors=True)


def _two_at_once(tmp_path: Path, home: Path, sessions: Path) -> None:
    cfg = churn_config(
        tmp_path,
        rows=600,
        network={"epochs": 2, "batch_size": 64},
        train={"folds": 1},
        scaling={"num_workers": 1, "env_vars": {"TRAINFLOW_TEST_SECRET": SENTINEL}},
        ray={"temp_dir": str(sessions)},
    )
    procs, servers = [], {}
    for i in range(2):
        log = (tmp_path / f"run-{i}.log").open("w")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainflow.flows.cli",
                    "retrain",
                    "--config",
                    str(cfg),
                    "--run-name",
                    "nightly",
                    "--summary-json",
                    str(tmp_path / f"summary-{i}.json"),
                ],
                env=_env(home),
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    deadline = time.monotonic() + 400
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        for p in procs:
            for pid in _children(p.pid, "uvicorn"):
                servers.setdefault(pid, p.pid)
        time.sleep(0.5)
    codes = [p.wait(timeout=10) for p in procs]
    logs = [(tmp_path / f"run-{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], "\n=====\n".join(log[-4000:] for log in logs)
    assert "Timed out while attempting to connect" not in "".join(logs)
    summaries = [json.loads((tmp_path / f"summary-{i}.json").read_text()) for i in range(2)]
    waited = [s for s in summaries if s.get("already_finished")]
    assert len(waited) == 1, [s.get("already_finished") for s in summaries]  # the second found the run finished
    first = next(s for s in summaries if not s.get("already_finished"))
    assert waited[0]["model_version"] == first["model_version"] == "1"
    assert any("waiting" in log and "lock on run nightly" in log for log in logs)  # said what it waited for
    assert sum("already finished  run nightly finished at" in log for log in logs) == 1

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(client.search_model_versions("name = 'churn-test'")) == 1
    runs = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert len([r for r in runs if r.data.tags.get("trainflow.retrain") == "nightly"]) == 1  # one parent run
    from trainflow.tables.outputs import read_manifest

    manifest = read_manifest(str(tmp_path / "out" / "predictions"))
    assert manifest["model"] == "models:/churn-test/1" and manifest["rows"] == 500
    # the checkpoints the registered version points at are where they were: nothing removed them
    version = client.get_model_version("churn-test", "1")
    assert Path(version.tags["trainflow.checkpoint_path"]).exists()

    # every temporary server either process started has stopped (Prefect's stop at exit; the kernel's parent-death
    # signal otherwise)
    assert servers and len(set(servers.values())) == 2, servers  # each ran its own
    time.sleep(1)
    assert not [pid for pid in servers if _alive(pid)]

    # the secret reached the workers' environment only: no file under the test's folder (storage, MLflow, the
    # predictions, the Ray sessions' logs) nor the Prefect home holds it, apart from the config that names it
    assert oct(sessions.stat().st_mode & 0o777) == "0o700" and (sessions / "ray").is_dir()
    found = subprocess.run(
        ["grep", "-rl", "--binary-files=text", SENTINEL, str(tmp_path), str(home), str(sessions)],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert found == [str(cfg)], found


SERVER_SCRIPT = textwrap.dedent(
    """
    import os, subprocess
    import trainflow.run.runtime as runtime
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    server = runtime.temporary_server()
    runtime.SERVER_START_TIMEOUT_S = 0  # a start on a machine so loaded that its health check never answers in time
    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 1}):
        try:
            server.start()
        except RuntimeError as exc:
            print("failed", "Timed out" in str(exc))
    kids = lambda: subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "uvicorn"], capture_output=True,
                                  text=True).stdout.split()
    print("left", kids(), server.running)
    runtime.SERVER_START_TIMEOUT_S = 120
    server.start()  # the flow client's retry: one server, the one that answers
    print("up", kids())
    """
)


def test_a_failed_server_start_stops_its_process_and_a_sigterm_during_start_up_leaves_none(tmp_path, prefect_home):
    home = prefect_home
    proc = subprocess.run(
        [sys.executable, "-c", SERVER_SCRIPT], cwd=REPO, env=_env(home), capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "failed True" in proc.stdout and "left [] False" in proc.stdout, proc.stdout
    up = [line for line in proc.stdout.splitlines() if line.startswith("up ")]
    pids = json.loads(up[0][3:].replace("'", '"'))
    assert len(pids) == 1 and not _alive(int(pids[0]))  # stopped when its process exited

    cfg = churn_config(tmp_path, rows=300)
    cli = subprocess.Popen(
        [sys.executable, "-m", "trainflow.flows.cli", "retrain", "--config", str(cfg)],
        env=_env(home),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline, server = time.monotonic() + 120, []
    while not server and time.monotonic() < deadline and cli.poll() is None:
        server = _children(cli.pid, "uvicorn")
        time.sleep(0.1)
    assert server, cli.communicate(timeout=30)[0][-3000:]
    cli.send_signal(signal.SIGTERM)  # while the server starts (or has just started), before any training
    out = cli.communicate(timeout=60)[0]
    assert cli.returncode != 0, out[-3000:]
    time.sleep(1)
    assert not _alive(server[0]), out[-3000:]
