"""Shared fixtures: one Prefect test server per session, a fixed-size local Ray per module."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

# pytest imports this file as `conftest` (tests/ is a namespace package: tests/test_user_model.py relies on it) and the
# tests import it as `tests.conftest`: one module under both names, so the session's database templates below are one
# list (with two modules, the templates the tests made were never removed, and a Prefect home made through
# `tests.conftest` never had the migrated database: its server migrated a new one, 6-8 s)
sys.modules.setdefault("tests.conftest", sys.modules[__name__])

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("RAY_ADDRESS", None)


# Tests that mostly wait (services stopped and started again, a Prefect server's worker and served flows, processes
# that start a Ray or a CLI of their own: two runs at once): `make test` runs them on a second pytest-xdist worker
# beside the rest (CPU-heavy fits there slow the first worker's: the exactly-once chain took 363 s there instead of
# 140, and 204 s with the time-split retrains there) ("--dist
# loadgroup" gives each group one worker, in collection order), on the CPU the others leave idle (on 2 cores, the
# serial suite kept one core idle a third of the time).
# Measured with durations on 2 cores: the fits' worker 1,219 s, this one 606 s: the fits that mostly wait too (retries
# with their delays, workers that keep dying, a cluster's lost node, an S3 server) moved here.
SIDE = (
    "tests/test_outages.py",
    "tests/test_runtime.py",
    "tests/test_deployments.py",
    "tests/test_concurrent_runs.py",
    "tests/test_retry_exhausted.py",
    "tests/test_cluster.py",
    "tests/test_s3.py",
    "tests/test_postgres.py",  # a PostgreSQL server of its own
    "tests/test_sinks.py",  # (its own too)
    "tests/test_approval.py",  # flow runs suspended and resumed: a fits' worker's load on this one
    "tests/test_week.py",  # (seven of them)
)
# tests/test_faults.py (fits that die and resume, 130 s) runs with the fits: measured 2026-12-02 with it here, this
# worker took 1,119-1,164 s and the fits' 717-985 s; tests/test_degrade.py (100 s) too, since the tests of one fit
# train in local mode (2026-12-05: this worker's tests about 1,260 s, the fits' about 1,000 s without it)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(items):
    """Modules that bring their own Ray (own_ray) run last, so the shared local Ray starts once
    instead of again after each of them (a local Ray start is 6-8 s here); each test's xdist group (SIDE)."""
    items.sort(key=lambda item: "own_ray" in getattr(item, "fixturenames", ()))
    for item in items:
        item.add_marker(pytest.mark.xdist_group("side" if item.nodeid.startswith(SIDE) else "main"))


@pytest.fixture(scope="session", autouse=True)
def _templates_removed():
    """The session's database templates (Prefect's, MLflow's) go with the session instead of piling up in /tmp."""
    yield
    for template in (*_PREFECT_TEMPLATE, *_MLFLOW_TEMPLATE):
        shutil.rmtree(template.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's test server, without flow-run heartbeats, as a local run has none on its temporary server
    (trainflow.run.runtime.local_flow_settings): nothing here reads them, and each flow run's end would wait up to a
    second for the heartbeat thread."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        with prefect_test_harness(server_startup_timeout=120):
            _snapshot_prefect_db()
            yield


_PREFECT_TEMPLATE: list[Path] = []


def _snapshot_prefect_db() -> None:
    """A copy of the test server's database as it started (migrated, Prefect's block types registered, no runs),
    taken with SQLite's backup API while the server runs: the database a Prefect home of a test's own starts from."""
    import sqlite3
    import tempfile

    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    source = PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1]
    template = Path(tempfile.mkdtemp(prefix="prefect-template-")) / "prefect.db"
    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(template)) as dst:
        src.backup(dst)
    _PREFECT_TEMPLATE.append(template)


@pytest.fixture
def prefect_home(prefect_harness, tmp_path_factory):
    """A new Prefect home (a folder) for a test's own servers and local runs, whose database starts as a copy of a
    migrated empty one: Prefect migrates a new home's database when its first server starts, 6-8 s here."""
    return new_prefect_home(tmp_path_factory.mktemp("prefect-home"))


def new_prefect_home(home: Path) -> Path:
    """home with a migrated empty Prefect database in it (the session's copy; prefect_harness takes it)."""
    home.mkdir(parents=True, exist_ok=True)
    if _PREFECT_TEMPLATE:
        shutil.copyfile(_PREFECT_TEMPLATE[0], home / "prefect.db")
    return home


@pytest.fixture(scope="session")
def _ray_session():
    yield
    import ray

    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_session):
    """One local Ray of 2 CPUs, started as trainflow starts it (ensure_ray, dashboard on), shared by every
    module that asks for it: its start-up and warm workers are paid once. A module that needs another Ray
    uses `own_ray`, which shuts this one down; the next module that asks for it starts it again."""
    import ray

    from trainflow.run.runtime import ensure_ray

    ensure_ray(num_cpus=2)
    yield ray


@pytest.fixture(scope="module")
def own_ray():
    """For modules that start their own Ray (a Cluster, other settings): no shared Ray in the way, none left."""
    import ray

    ray.shutdown()
    yield
    ray.shutdown()


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for servers the tests start."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_regression_table(rows: int, seed: int = 0, with_label: bool = True) -> pa.Table:
    """y = 3*x1 - 2*x2^2 + a category offset + noise; names with spaces and punctuation."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=rows), rng.normal(size=rows)
    cat = rng.choice(["a", "b", "c"], rows)
    y = 3 * x1 - 2 * x2**2 + np.select([cat == "a", cat == "b"], [1.0, -1.0], 0.0) + rng.normal(0, 0.1, rows)
    cols = {"row id": np.arange(rows), "x 1 (m/s)": x1, "x-2": x2, "kind, class": cat}
    if with_label:
        cols["target y"] = y
    return pa.table(cols)


def daily_table(days: int, per_day: int, seed: int, logit) -> pa.Table:
    """per_day rows a day over `days` days from 2013-01-01: id, when (a date), x1, x2 and a binary y drawn from
    logit(day, x1, x2) plus noise: the dated tables of the tests of roles by time and of replay."""
    import datetime as dt

    rng = np.random.default_rng(seed)
    day = np.repeat(np.arange(days), per_day)
    n = len(day)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    y = ((logit(day, x1, x2) + rng.normal(0, 0.5, n)) > 0).astype(np.int64)
    return pa.table(
        {
            "id": np.arange(n),
            "when": pa.array([dt.date(2013, 1, 1) + dt.timedelta(days=int(d)) for d in day]),
            "x1": x1,
            "x2": x2,
            "y": y,
        }
    )


def dir_bytes(folder: Path) -> int:
    """The bytes of every file under folder."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def write_parquet(table: pa.Table, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


_MLFLOW_TEMPLATE: list[Path] = []


def empty_mlflow_store() -> Path:
    """An empty MLflow SQLite store, created (migrated) once per session: a new store's migrations take 1.5-3 s,
    paid otherwise by every test that runs a flow."""
    if not _MLFLOW_TEMPLATE:
        import tempfile

        import mlflow

        db = Path(tempfile.mkdtemp(prefix="mlflow-template-")) / "mlflow.db"
        mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
        _MLFLOW_TEMPLATE.append(db)
    return _MLFLOW_TEMPLATE[0]


def sqlite_registry(directory: Path, name: str = "m", versions: int = 3):
    """A real MLflow SQLite registry under directory holding `versions` versions of model `name` (a local source)."""
    import mlflow

    uri = f"sqlite:///{directory / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(name)
    (directory / "model").mkdir(exist_ok=True)
    for _ in range(versions):
        client.create_model_version(name, str(directory / "model"))
    return client, uri


def tiny_preprocessor():
    """A fitted classification preprocessor built from its numbers (no table, no Ray): x1, x2, kind, city -> y."""
    from trainflow.preprocessors.tabular import TabularPreprocessor

    return TabularPreprocessor.from_stats(
        "classification",
        "y",
        ["x1", "x2", "kind", "city"],
        {"x1": (0.0, 1.0, -3.0, 3.0), "x2": (5.0, 2.0, 0.0, 10.0)},
        {"kind": {"a": 10, "b": 20}, "city": {f"c{i}": 10 for i in range(40)}},
        ["no", "yes"],
        None,
        100,
        {"no": 60, "yes": 40},
    )


def tiny_checkpoint(tmp_path: Path, hidden=(8,)) -> Path:
    """An untrained network's checkpoint over tiny_preprocessor, temperature-calibrated, as trainflow writes one
    (tmp_path/ckpt): what serving, registering and scoring read, without a training run."""
    from trainflow.config import config_from_dict
    from trainflow.trainer.serving.calibration import write_calibration
    from trainflow.trainer.serving.checkpoint import save_checkpoint
    from trainflow.trainer.families.network import model_for

    prep = tiny_preprocessor()
    cfg = config_from_dict(
        {
            "data": {"path": "mem", "label": "y"},
            "task": "classification",
            "model": {"type": "mlp", "hidden_sizes": list(hidden)},
        },
        base_dir=tmp_path,
    )
    raw = cfg.to_dict()
    model = model_for(prep, raw["model"])
    d = tmp_path / "ckpt"
    d.mkdir()
    save_checkpoint(d, model.state_dict(), {"epoch": 0}, {"val_loss": 0.5}, [], prep.to_dict(), raw)
    write_calibration(d, {"method": "temperature", "temperature": 1.5})
    return d


def tiny_table(rows: int = 50) -> pa.Table:
    """Rows tiny_checkpoint scores (id, x1, x2, kind, city; no label)."""
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "id": np.arange(rows),
            "x1": rng.normal(size=rows),
            "x2": rng.normal(5, 2, rows),
            "kind": rng.choice(["a", "b"], rows),
            "city": rng.choice([f"c{i}" for i in range(40)], rows),
        }
    )


def write_config(directory: Path, raw: dict[str, Any], name: str = "config.yaml") -> Path:
    """The config as YAML in directory; its MLflow SQLite store (directory/mlflow.db when no tracking URI is set,
    beside a relative storage_path), when it does not exist yet, starts as a copy of an empty one."""
    uri = (raw.get("mlflow") or {}).get("tracking_uri") or f"sqlite:///{directory / 'mlflow.db'}"
    db = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:////") else None
    if db is not None and not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(empty_mlflow_store(), db)
    path = directory / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def execute_flow_run(flow_run_id):
    """Run a deployment's retrain flow run in this process as a worker's process does (Prefect's flow engine with the
    run the server scheduled), against the session's Prefect server; the state it ends in (Paused on a suspension)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import Pause
    from prefect.flow_engine import run_flow

    from trainflow.flows.retrain import retrain

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    try:
        run_flow(retrain, flow_run=run, parameters=run.parameters, return_type="state")
    except Pause:
        pass
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state


def xgboost_config(tmp_path: Path, data: dict[str, Any], registered_model: str, **extra: Any) -> str:
    """A short one-family (XGBoost, 20 rounds, one worker) classification config of the churn columns over data (a
    table's source keys; label and id given), inside tmp_path: the tests of sources and sinks."""
    raw: dict[str, Any] = {
        "data": {"label": "churned", "id_column": "customer_id", **data},
        "task": "classification",
        "model": {"type": "xgboost", "params": {"xgboost": {"num_boost_round": 20}}},
        "train": {"folds": 1},
        "scaling": {"num_workers": 1},
        "storage_path": "runs",
        "mlflow": {"experiment": registered_model, "registered_model": registered_model},
        **extra,
    }
    return str(write_config(tmp_path, raw))


# the small network churn_config's configs train: 3 epochs of 128 rows (its keys: model.params.<mlp|torch>)
SMALL_NETWORK = {"epochs": 3, "batch_size": 128, "learning_rate": 0.005}


def churn_config(tmp_path: Path, rows: int = 3000, network: dict[str, Any] | None = None, **sections: Any) -> Path:
    """A small classification config over the bundled sample generator, inside tmp_path. network: the trained
    network's own keys (epochs, batch_size, ...) over SMALL_NETWORK, in the block of each network model.type trains
    (model.params.mlp, model.params.torch; a key the test's own block sets wins)."""
    from trainflow.tables.sample import make_churn_table

    write_parquet(make_churn_table(rows, seed=1), tmp_path / "data" / "train.parquet")
    write_parquet(
        make_churn_table(500, seed=2, with_label=False, id_offset=10_000), tmp_path / "data" / "score.parquet"
    )
    raw: dict[str, Any] = {
        "data": {"path": "data/train.parquet", "label": "churned", "id_column": "customer_id"},
        "task": "classification",
        "model": {"type": "mlp"},  # one family: the default (auto) trains three and their ensemble
        "train": {"folds": 1},  # one split: cross-fitting has its own tests
        "scaling": {"num_workers": 1},  # one worker: DDP across workers has its own tests (each run starts less)
        "checkpoint": {"num_to_keep": 3, "metric": "val_loss"},
        "storage_path": "runs",
        "mlflow": {"experiment": "test", "registered_model": "churn-test"},
        "inference": {"input": "data/score.parquet", "output": "out/predictions"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    kind = raw["model"].get("type", "auto")
    trained = {"mlp"} if kind == "auto" else {kind} if isinstance(kind, str) else set(kind)
    for family in sorted(trained & {"mlp", "torch"}):
        params = raw["model"].setdefault("params", {})
        block = params.setdefault(family, {})
        for k, v in {**SMALL_NETWORK, **(network or {})}.items():
            block.setdefault(k, v)
    return write_config(tmp_path, raw)


@pytest.fixture(autouse=True)
def _no_tracking_uri_leak(monkeypatch):
    """Each test's config decides its MLflow store; nothing inherited from an earlier test."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    import mlflow

    mlflow.set_tracking_uri(None)


@contextlib.contextmanager
def info_logs_to_server():
    """The run loggers' INFO lines sent to the Prefect server for the block (the suite runs at WARNING): in the
    settings, for a flow run that configures logging afresh, and on the loggers already configured, whose console
    handlers stay at WARNING (an earlier test's captured stream may be closed)."""
    from prefect.logging.handlers import PrefectConsoleHandler
    from prefect.settings import PREFECT_LOGGING_LEVEL, temporary_settings

    prefect_logger = logging.getLogger("prefect")
    consoles = [
        h
        for name in ("", "prefect", "prefect.task_runs", "prefect.flow_runs")
        for h in logging.getLogger(name).handlers
        if isinstance(h, PrefectConsoleHandler)
    ]
    saved = prefect_logger.level, [h.level for h in consoles]
    prefect_logger.setLevel(logging.INFO)
    for h in consoles:
        h.setLevel(max(h.level, logging.WARNING))
    try:
        with temporary_settings({PREFECT_LOGGING_LEVEL: "INFO"}):
            yield
    finally:
        prefect_logger.setLevel(saved[0])
        for h, level in zip(consoles, saved[1]):
            h.setLevel(level)


def flow_run_logs(flow_run_id: str) -> list:
    """The flow run's log lines as the Prefect server stored them (timestamp, message), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)


def prefect_events(name: str, since, count: int = 1, timeout_s: float = 30.0) -> list:
    """The events called name that the Prefect server stored since `since` (a datetime), oldest first, read until
    `count` are there or timeout_s passes (the server persists events in batches, a few seconds apart)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    deadline = time.monotonic() + timeout_s
    while True:
        with get_client(sync_client=True) as client:
            events = client.read_events(
                EventFilter(occurred=EventOccurredFilter(since=since), event=EventNameFilter(name=[name])), limit=50
            ).events
        if len(events) >= count or time.monotonic() > deadline:
            return sorted(events, key=lambda e: e.occurred)
        time.sleep(1)


BUCKET = "trainflow-test"


class Moto:
    """moto's S3 server on a loopback port that a test can stop and start again: the buckets live in this process
    (moto's backends), so what was stored is there again after a restart, as with a real store back from an outage."""

    def __init__(self, port: int):
        self.port, self.server = port, None
        self.start()

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="module")
def moto_server():
    """moto's S3 server on a free loopback port (a Moto); AWS settings point pyarrow (and the Ray workers) at it."""
    import pyarrow.fs as pafs

    moto = Moto(free_port())
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{moto.port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    pafs.S3FileSystem(
        endpoint_override=f"127.0.0.1:{moto.port}",
        scheme="http",
        access_key="testing",
        secret_key="testing",
        allow_bucket_creation=True,
    ).create_dir(BUCKET)
    yield moto
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    moto.stop()


@pytest.fixture(scope="module")
def s3_endpoint(moto_server):
    """The pyarrow filesystem of moto_server's S3, as trainflow opens it."""
    from trainflow.run.storage import filesystem_for

    fs, _ = filesystem_for(f"s3://{BUCKET}")
    yield fs
