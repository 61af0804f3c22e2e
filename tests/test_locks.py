"""Locks die with their holder: a SIGKILLed output writer or gate frees its lock at once (no Prefect server), a
waiter names the holder while it waits and in its timeout, and a killed writer's staging folder is cleaned under
the next writer's lock. Real processes, real SIGKILLs, real Parquet writes."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainflow.run import locks
from trainflow.run.locks import LockTimeout, exclusive, lock_dir, lock_name
from trainflow.tables.outputs import MANIFEST, write_output

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def local_locks(tmp_path, monkeypatch):
    """No Prefect API configured (a laptop's local run): file locks under a private PREFECT_HOME."""
    home = tmp_path / "prefect-home"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings({PREFECT_HOME: str(home), PREFECT_API_URL: None}):
        assert not locks.prefect_server_configured()
        yield home


def test_a_lock_names_one_place_however_it_is_spelled(tmp_path, local_locks):
    """Two spellings of one SQLite registry (or one storage folder) are one lock; two places are two. A run's lock
    with --no-wait fails at once naming its holder."""
    db = tmp_path / "mlflow.db"
    assert lock_name("champion", "m", f"sqlite:///{db}") == lock_name(
        "champion", "m", f"sqlite:///{tmp_path}/./mlflow.db"
    )
    assert lock_name("run", "r", str(tmp_path / "runs")) == lock_name("run", "r", f"file://{tmp_path}/runs/")
    assert lock_name("champion", "m", f"sqlite:///{db}") != lock_name("champion", "m", f"sqlite:///{tmp_path}/x.db")
    with locks.run_lock(str(tmp_path / "runs"), "nightly"):
        with pytest.raises(
            LockTimeout,
            match=r"run nightly is in use: the lock trainflow-run-nightly-\w+ is held by "
            rf"process {os.getpid()}",
        ):
            with locks.run_lock(f"{tmp_path}/./runs", "nightly", wait=False):
                pass


def _spawn(script: str, home: Path) -> subprocess.Popen:
    env = {**os.environ, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the holder exited early: {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, "the holder never took its lock"
        time.sleep(0.1)


def _holder_record(name: str) -> dict | None:
    try:
        return json.loads((lock_dir() / f"{name}.lock").read_text() or "null")
    except (OSError, ValueError):
        return None


def test_a_sigkilled_gate_frees_the_champion_lock_at_once_and_a_waiter_names_it(local_locks, caplog, monkeypatch):
    name = lock_name("champion", "churn-model", "sqlite:///mlflow.db")
    holder = _spawn(
        """
        import time
        from trainflow.run.locks import exclusive
        with exclusive("champion", "churn-model", "sqlite:///mlflow.db"):
            time.sleep(600)  # a retrain inside promote, between the lock and the alias move
    """,
        local_locks,
    )
    try:
        _wait_for(lambda: (_holder_record(name) or {}).get("pid") == holder.pid, holder)
        monkeypatch.setattr(locks, "WAIT_NOTE_S", 0.2)
        caplog.set_level(logging.WARNING, logger="trainflow.run.locks")
        with (
            pytest.raises(LockTimeout) as err,
            exclusive("champion", "churn-model", "sqlite:///mlflow.db", timeout_s=1.0),
        ):
            pass
        assert f"process {holder.pid}" in str(err.value) and name in str(err.value)
        assert any(f"process {holder.pid}" in r.getMessage() for r in caplog.records), "the waiter said nothing"
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        start = time.monotonic()
        with exclusive("champion", "churn-model", "sqlite:///mlflow.db", timeout_s=5.0):
            taken = time.monotonic() - start
            assert _holder_record(name)["pid"] == os.getpid()
        assert taken < 5.0
    finally:
        if holder.poll() is None:
            holder.kill()


def _table(rows: int, value: float) -> pa.Table:
    return pa.table({"id": list(range(rows)), "prediction": [value] * rows})


def test_a_sigkilled_writer_leaves_its_output_whole_and_the_next_write_cleans_its_staging(local_locks, tmp_path):
    out = tmp_path / "out" / "predictions"
    write_output(_table(10, 1.0), str(out), 10, {"model": "v1"})
    # a predict killed while it writes: the Parquet write stalls inside the staging folder, then SIGKILL
    writer = _spawn(
        f"""
        import time
        import pyarrow as pa, pyarrow.parquet as pq
        real = pq.write_table
        def stalled(table, where, **kw):
            real(table, where, **kw)
            print("written", flush=True)
            time.sleep(600)
        pq.write_table = stalled
        from trainflow.tables.outputs import write_output
        write_output(pa.table({{"id": list(range(10)), "prediction": [2.0] * 10}}), {str(out)!r}, 10, {{"model": "v2"}})
    """,
        local_locks,
    )
    try:
        assert writer.stdout.readline().strip() == "written", writer.stderr.read()[-2000:]
        stages = [p.name for p in out.parent.iterdir() if ".trainflow-tmp-" in p.name]
        assert len(stages) == 1
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
    finally:
        if writer.poll() is None:
            writer.kill()
    # the previous output is untouched, the dead staging folder still beside it
    assert pq.read_table(out).column("prediction").to_pylist() == [1.0] * 10
    (out.parent / ".predictions.trainflow-tmp-0123456789ab").mkdir()  # another killed writer's leftover
    (out.parent / ".predictions.trainflow-tmp-notours").mkdir()  # not trainflow's name: left alone
    start = time.monotonic()
    write_output(_table(10, 3.0), str(out), 10, {"model": "v3"})
    assert time.monotonic() - start < 30
    assert pq.read_table(out).column("prediction").to_pylist() == [3.0] * 10
    assert json.loads((out / MANIFEST).read_text())["model"] == "v3"
    left = sorted(p.name for p in out.parent.iterdir())
    assert left == [".predictions.trainflow-tmp-notours", "predictions"]


def test_an_output_a_crash_left_under_its_hidden_name_is_put_back_before_staging_is_cleaned(local_locks, tmp_path):
    out = tmp_path / "predictions"
    write_output(_table(5, 1.0), str(out), 5, {"model": "v1"})
    hidden = tmp_path / ".predictions.trainflow-old-00000000abcd"
    out.rename(hidden)  # a crash between the two renames where the system has no atomic swap
    from trainflow.tables.outputs import clear_dead_stages

    assert clear_dead_stages(str(tmp_path), "predictions") == []
    assert pq.read_table(out).num_rows == 5 and not hidden.exists()


@pytest.mark.usefixtures("prefect_harness")
def test_on_a_prefect_server_a_run_that_does_not_wait_is_refused_only_while_the_lock_is_held(tmp_path):
    """Against a Prefect server the lock is a global concurrency limit: a run that does not wait takes a free one
    (a second's wait that runs out on a slow server asks again while no slot is taken) and is refused, naming the
    holder, while another holds it."""
    assert locks.prefect_server_configured()
    storage = str(tmp_path / "runs")
    name = lock_name("run", "nightly", storage)
    with locks.run_lock(storage, "nightly", wait=False):
        assert locks._occupied(name)
        with pytest.raises(LockTimeout, match=rf"run nightly is in use: the lock {name} is held by process"):
            with locks.run_lock(storage, "nightly", wait=False):
                pass
    assert not locks._occupied(name)
    with locks.run_lock(storage, "nightly", wait=False):  # free again: taken at once
        pass
