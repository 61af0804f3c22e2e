"""Real servers on loopback for the tests: `prefect server start` and `mlflow server`, each in a process group of
its own that a test can stop (a service gone away) and start again on the same port and store."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def start(args: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        args, env=env, cwd=cwd, stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc: subprocess.Popen) -> None:
    """Stop a process and everything it started (a worker's flow-run processes, the server's children)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"{url} did not answer:\n{log.read_text()[-3000:]}")
        time.sleep(0.25)


def prefect_env(home: Path) -> dict[str, str]:
    """This environment without Prefect's settings (and Ray's address), with a Prefect home of its own."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "RAY_ADDRESS"}
    base.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="INFO")
    return base


def prefect_server(home: Path, port: int) -> subprocess.Popen:
    """`prefect server start` on 127.0.0.1:port with its database under home, once it answers."""
    proc = start(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        # the UI asks this address for its API (its default is port 4200 whatever --port says)
        {**prefect_env(home), "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"},
        home / "server.log",
        home,
    )
    wait_healthy(f"http://127.0.0.1:{port}/api/health", proc, home / "server.log")
    return proc


def mlflow_server(folder: Path, port: int) -> subprocess.Popen:
    """`mlflow server` on 127.0.0.1:port, its store a SQLite file and its artifacts a folder under folder (without
    MLflow's job consumers, which this suite does not use), once it answers."""
    from tests.conftest import empty_mlflow_store

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "mlflow.db").exists():  # a new store starts migrated (as the tests' SQLite stores do)
        shutil.copyfile(empty_mlflow_store(), folder / "mlflow.db")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = start(
        [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder / 'mlflow.db'}",
            "--artifacts-destination",
            str(folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env,
        folder / "server.log",
        folder,
    )
    wait_healthy(f"http://127.0.0.1:{port}/health", proc, folder / "server.log")
    return proc


class Postgres:
    """A PostgreSQL server of its own on 127.0.0.1:port, from the binaries on this machine (initdb, pg_ctl,
    postgres: PostgreSQL 15 is installed on the machines the suite runs on), with password login for one user.
    Run as the `postgres` account where the suite runs as root (the server refuses root). stop() and start()
    take it away and bring it back on the same port and data."""

    USER, PASSWORD = "trainflow", "pg-Secret-7f3a9"

    def __init__(self, port: int):
        missing = [b for b in ("initdb", "pg_ctl", "postgres") if shutil.which(b) is None]
        if missing:
            pytest.fail(
                f"the PostgreSQL tests start a server from PostgreSQL's binaries, and {missing} are not on the PATH: "
                "install PostgreSQL 15 (e.g. apt-get install postgresql-15, then add /usr/lib/postgresql/15/bin to "
                "the PATH)"
            )
        import tempfile

        self.port = port
        # under /tmp itself: the server's account must reach it (pytest's tmp folders are the test runner's only)
        self.folder = Path(tempfile.mkdtemp(prefix="trainflow-pg-", dir="/tmp"))
        self.as_root = os.geteuid() == 0
        (self.folder / "pw").write_text(self.PASSWORD + "\n")
        if self.as_root:
            shutil.chown(self.folder, "postgres")
            shutil.chown(self.folder / "pw", "postgres")
        self._run(
            [
                "initdb",
                "-D",
                str(self.folder / "data"),
                "-U",
                self.USER,
                "--auth=scram-sha-256",
                f"--pwfile={self.folder / 'pw'}",
                "--no-sync",
            ]
        )
        (self.folder / "pw").unlink()
        self.start()

    def _run(self, args: list[str]) -> None:
        command = ["runuser", "-u", "postgres", "--", *args] if self.as_root else args
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/tmp")
        if done.returncode != 0:
            pytest.fail(f"{' '.join(args[:2])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            ["pg_ctl", "-D", str(self.folder / "data"), "-o", options, "-l", str(self.folder / "log"), "-w", "start"]
        )

    def stop(self) -> None:
        self._run(["pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop"])

    def close(self) -> None:
        subprocess.run(
            (["runuser", "-u", "postgres", "--"] if self.as_root else [])
            + ["pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def connection(self) -> str:
        """The URI a config names (no password: PGPASSWORD or a Secret block)."""
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/postgres"

    def connect(self):
        import adbc_driver_postgresql.dbapi as pg

        return pg.connect(f"postgresql://{self.USER}:{self.PASSWORD}@127.0.0.1:{self.port}/postgres", autocommit=True)

    def load(self, name: str, table, mode: str = "create") -> None:
        """table (pyarrow) into the server's table name (create it, or append to it)."""
        with self.connect() as conn, conn.cursor() as cursor:
            cursor.adbc_ingest(name, table, mode=mode)

    def execute(self, sql: str):
        with self.connect() as conn, conn.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchall() if cursor.description else None
