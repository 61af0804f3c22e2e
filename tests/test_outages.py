"""Services that go away for longer than their clients retry: a real `mlflow server`, `prefect server start` and
moto's S3 server on loopback, each stopped while trainflow needs it. Within its wait (services.*_wait_s) the run
says what it waits for and completes when the service is back; past it the run fails with exit 1 naming the service,
having moved or written nothing (the same command completing once the service is back is the first half). Waits are shortened to seconds here;
`python -m bench outage-soak` does the same with minutes-long outages."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time

import mlflow
import pytest
import yaml

from tests.conftest import BUCKET, Moto, churn_config, free_port, sqlite_registry, write_config
from tests.servers import BIN, mlflow_server, prefect_env, prefect_server, stop
from trainflow.flows.cli import main as cli_main
from trainflow.tables.sample import make_churn_table
from trainflow.run.tracking import CHAMPION


def _served_before(client) -> None:
    """Versions 1 and 2 of m served as @champion (their periods recorded, as the gate records them); 3 serves now, set
    by hand: a rollback to 1 or 2 is a rollback to a version that served."""
    from trainflow.champion import record_move

    for old, new in ((None, "1"), ("1", "2")):
        client.set_registered_model_alias("m", CHAMPION, new)
        record_move(client, "m", old, new, "the gate", "the gate (a test)")
    client.set_registered_model_alias("m", CHAMPION, "3")


def _later(seconds: float, start):
    """start() on a thread after seconds: the service coming back while the command waits."""
    box: dict = {}

    def run() -> None:
        time.sleep(seconds)
        box["server"] = start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _waits_then_passes(command, thread, box: dict, caplog, service: str, where: str, key: str):
    """command() returns 0 while the service comes back on thread; it said it waited for service at where (key). The
    service started again."""
    try:
        assert command() == 0
    finally:
        thread.join()
    said = [r.getMessage() for r in caplog.records if r.name == "trainflow.run.services"]
    assert any(f"waiting for {service} at {where}" in m and f"services.{key}" in m for m in said), said
    return box["server"]


@contextlib.contextmanager
def _lines_of(logger: str):
    """The messages logger emits meanwhile, whatever handlers and propagation a flow run sets up."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger(logger).addHandler(handler)
    try:
        yield said
    finally:
        logging.getLogger(logger).removeHandler(handler)


def _registry(client: mlflow.MlflowClient, name: str, versions: int) -> None:
    client.create_registered_model(name)
    experiment = client.create_experiment("outage")
    for _ in range(versions):
        run = client.create_run(experiment)
        client.log_text(run.info.run_id, "a model", "model/MLmodel")
        client.create_model_version(name, f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
        client.set_terminated(run.info.run_id)


def _champion(client: mlflow.MlflowClient, name: str) -> str:
    return str(client.get_model_version_by_alias(name, CHAMPION).version)


def test_an_mlflow_server_away_is_waited_for_within_its_wait_and_named_past_it(tmp_path, capsys, caplog):
    port = free_port()
    uri, folder = f"http://127.0.0.1:{port}", tmp_path / "mlflow"
    server = mlflow_server(folder, port)
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    _registry(client, "m", 3)
    _served_before(client)
    raw = {
        "data": {"path": str(tmp_path / "t.parquet"), "label": "y"},
        "task": "regression",
        "mlflow": {"tracking_uri": uri, "registered_model": "m"},
        "services": {"mlflow_wait_s": 60},
    }
    cfg = write_config(tmp_path, raw)
    rollback = ["champion", "rollback", "--config", str(cfg), "--reason", "v3 mislabels refunds"]

    # away for a few seconds, within the wait: the rollback says what it waits for, then completes
    stop(server)
    thread, box = _later(1, lambda: mlflow_server(folder, port))
    caplog.set_level("WARNING", logger="trainflow.run.services")
    server = _waits_then_passes(
        lambda: cli_main([*rollback, "--to", "1"]),
        thread,
        box,
        caplog,
        "the MLflow tracking server",
        uri,
        "mlflow_wait_s",
    )
    assert _champion(client, "m") == "1"

    # away for longer than the wait: exit 1 naming the server and the key, nothing moved; back, the rerun moves it
    raw["services"]["mlflow_wait_s"] = 3
    write_config(tmp_path, raw)
    stop(server)
    capsys.readouterr()
    started = time.monotonic()
    assert cli_main([*rollback, "--to", "2"]) == 1
    err = capsys.readouterr().err
    assert f"the MLflow tracking server at {uri} did not answer" in err and "services.mlflow_wait_s" in err, err
    assert time.monotonic() - started < 30  # bounded by the wait, not MLflow's default four minutes
    stored = f"sqlite:///{folder / 'mlflow.db'}"  # the server's own store, read while it is away
    assert _champion(mlflow.MlflowClient(tracking_uri=stored, registry_uri=stored), "m") == "1"


def test_a_prefect_api_away_is_waited_for_mid_run_and_before_it_and_named_past_its_wait(tmp_path, caplog, prefect_home):
    home, port = prefect_home, free_port()
    server = prefect_server(home, port)
    client, store = sqlite_registry(tmp_path)
    _served_before(client)
    raw = {
        "data": {"path": str(tmp_path / "t.parquet"), "label": "y"},
        "task": "regression",
        "mlflow": {"tracking_uri": store, "registered_model": "m"},
        "services": {"prefect_wait_s": 90},
    }
    cfg = write_config(tmp_path, raw)
    env = {**prefect_env(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}

    command = [str(BIN / "trainflow"), "champion", "rollback", "--config", str(cfg), "--reason", "v3 mislabels refunds"]

    def rollback(to: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, "--to", to], env=env, capture_output=True, text=True, timeout=240)

    def rollback_while_away(to: str, back: dict) -> tuple[int, str]:
        """The rollback started with the API away; the server is started again once the command says it waits
        (not after a fixed delay: a slow start of the command would otherwise find the server already back)."""
        process = subprocess.Popen(
            [*command, "--to", to], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        said = []
        try:
            for line in process.stderr:
                said.append(line)
                if "waiting for the Prefect API" in line and "server" not in back:
                    back["server"] = prefect_server(home, port)
            process.wait(timeout=240)
        finally:
            if process.poll() is None:
                process.kill()
        return process.returncode, "".join(said)

    # the API away in the middle of a run: the Prefect client's retries, sized to the wait, carry the run over
    # the gap, and trainflow's line says what it waits for
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trainflow.run import services

    services.apply(60, 60, 60, None)
    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}), services.prefect_client_retries():
        with get_client(sync_client=True) as prefect:
            prefect.hello()  # connected once: from here on the client retries a refused connection
            stop(server)
            thread, box = _later(1, lambda: prefect_server(home, port))
            try:
                caplog.set_level("WARNING", logger="trainflow.run.services")
                assert prefect.read_flows(limit=1) is not None
            finally:
                thread.join()
    server = box["server"]
    said = [r.getMessage() for r in caplog.records if r.name == "trainflow.run.services"]
    assert any(f"waiting for the Prefect API at http://127.0.0.1:{port}/api" in m for m in said), said

    # the API away when the command starts (Prefect's client retries only after a first connection): trainflow
    # waits for it, saying so, and the rollback goes through the Prefect server's lock once it is back
    stop(server)
    back: dict = {}
    code, said = rollback_while_away("1", back)
    server = back.get("server", server)
    try:
        assert f"waiting for the Prefect API at http://127.0.0.1:{port}/api" in said, said[-3000:]
        assert code == 0, said[-3000:]
        assert _champion(client, "m") == "1"

        # away for longer than the wait: exit 1 naming the API and the key; nothing moved
        raw["services"]["prefect_wait_s"] = 3
        write_config(tmp_path, raw)
        stop(server)
        failed = rollback("2")
        assert failed.returncode == 1, failed.stderr[-3000:]
        assert f"the Prefect API at http://127.0.0.1:{port}/api did not answer" in failed.stderr
        assert "services.prefect_wait_s" in failed.stderr and _champion(client, "m") == "1"
    finally:
        stop(server)


@pytest.mark.usefixtures("prefect_harness", "ray_local")
def test_an_object_store_away_is_waited_for_and_named_past_its_wait(tmp_path, capsys, caplog, monkeypatch):
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    moto = Moto(port)
    fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True)
    fs.create_dir(BUCKET)
    pq.write_table(make_churn_table(400, seed=4), f"{BUCKET}/churn.parquet", filesystem=fs)
    cfg = churn_config(tmp_path, rows=50)
    raw = yaml.safe_load(cfg.read_text())
    raw["data"]["path"] = f"s3://{BUCKET}/churn.parquet"
    raw["services"] = {"storage_wait_s": 60}
    write_config(tmp_path, raw)
    caplog.set_level("WARNING", logger="trainflow.run.services")
    try:
        # away when validate reads the table, for longer than pyarrow's own retries (about 6 s): it waits, saying
        # so, and validates once the store is back
        moto.stop()
        thread, box = _later(9, moto.start)
        _waits_then_passes(
            lambda: cli_main(["validate", "--config", str(cfg)]),
            thread,
            box,
            caplog,
            "the object store",
            endpoint,
            "storage_wait_s",
        )

        # away for longer than the wait: exit 1 naming the store, before anything starts
        raw["services"]["storage_wait_s"] = 2
        write_config(tmp_path, raw)
        moto.stop()
        capsys.readouterr()
        assert cli_main(["validate", "--config", str(cfg)]) == 1
        err = capsys.readouterr().err
        assert f"the object store at {endpoint}" in err and "services.storage_wait_s" in err, err
    finally:
        moto.stop()


def test_a_worker_waits_as_its_run_says_and_an_outage_raised_there_reaches_the_driver_whole(tmp_path):
    """Ray Train's workers, and trainflow's callback in its controller, take the run's waits (services.*) from the
    config they are given, not the defaults (the controller waited 292 s for a store the run said to wait 2 s for),
    and ServiceUnavailable survives the pickling that carries a worker's error to the driver."""
    import pickle

    from trainflow.config import config_from_dict
    from trainflow.run.services import WAITS, ServiceUnavailable
    from trainflow.trainer.watchdog import Watched

    cfg = config_from_dict(
        {
            "data": {"path": "x", "label": "y"},
            "task": "regression",
            "services": {"storage_wait_s": 7, "mlflow_wait_s": 8, "prefect_wait_s": 9},
        }
    )
    WAITS.storage = WAITS.mlflow = WAITS.prefect = 300.0  # a fresh worker process's defaults
    seen = Watched(lambda loop_config: (WAITS.storage, WAITS.mlflow, WAITS.prefect), None)({"config": cfg})
    assert seen == (7, 8, 9)
    from trainflow.trainer.recovery import RecoveryLog, read_events

    WAITS.storage = 300.0  # the controller's defaults
    RecoveryLog(str(tmp_path), cfg).after_exception(None, {0: RuntimeError("worker lost")})
    assert WAITS.storage == 7 and read_events(str(tmp_path))[-1]["error"] == "worker 0: RuntimeError: worker lost"
    exc = ServiceUnavailable("the object store", "http://127.0.0.1:9 (s3)", 6.2, "storage_wait_s", "curlCode: 7")
    back = pickle.loads(pickle.dumps(exc))
    assert (type(back), str(back), back.service, back.where) == (ServiceUnavailable, str(exc), exc.service, exc.where)


@pytest.mark.usefixtures("prefect_harness")
def test_an_mlflow_server_away_after_the_predictions_are_written_is_waited_for_and_named_past_its_wait(
    tmp_path, capsys, monkeypatch
):
    """The last thing a scoring run does is record its estimate (CBPE) on the served version's MLflow run, after the
    predictions are committed. The server gone at that moment: within its wait the run says so and records the
    estimate once it is back; past it, exit 1 naming the server, the committed output whole (every input row, its
    manifest naming the version) and no estimate recorded; the same command with the server back records it."""
    from tests.conftest import tiny_checkpoint, tiny_table, write_parquet
    from trainflow.tables.outputs import read_manifest
    from trainflow.tasks import infer
    from trainflow.tasks.model_package import MODEL_CODE, requirements

    port = free_port()
    uri, folder = f"http://127.0.0.1:{port}", tmp_path / "mlflow"
    servers = [mlflow_server(folder, port)]
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment("scoring")
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.pyfunc.log_model(
            name="model",
            python_model=MODEL_CODE,
            artifacts={"checkpoint": str(tiny_checkpoint(tmp_path))},
            pip_requirements=requirements(["mlp"]),
            registered_model_name="m",
        )
    mlflow.set_tracking_uri(None)
    write_parquet(tiny_table(300), tmp_path / "score.parquet")
    output = tmp_path / "predictions"
    raw = {
        "data": {"path": str(tmp_path / "score.parquet"), "label": "y", "id_column": "id"},
        "task": "classification",
        "mlflow": {"tracking_uri": uri, "registered_model": "m"},
        "services": {"mlflow_wait_s": 60},
        "inference": {"input": str(tmp_path / "score.parquet"), "output": str(output)},
    }
    cfg = write_config(tmp_path, raw)
    predict = ["predict", "--config", str(cfg), "--model", "models:/m/1"]
    committed = infer.write_output
    gone: dict = {"back_after_s": 0}  # started again at once: back within seconds

    def server_gone_once_committed(*args, **kwargs):  # the predictions committed, then the server stops
        rows = committed(*args, **kwargs)
        stop(servers[-1])
        if gone["back_after_s"] is not None:
            gone["thread"], _ = _later(gone["back_after_s"], lambda: servers.append(mlflow_server(folder, port)))
        return rows

    monkeypatch.setattr(infer, "write_output", server_gone_once_committed)
    estimates = lambda: client.get_metric_history(run.info.run_id, "estimated_val_accuracy")  # noqa: E731
    try:
        # within the wait: says what it waits for, then records the estimate once the server is back
        with _lines_of("trainflow.run.services") as said:  # (inside a flow run Prefect's handlers take the line)
            assert cli_main(predict) == 0
        gone["thread"].join()
        assert any(
            f"waiting for the MLflow tracking server at {uri}" in m and "services.mlflow_wait_s" in m for m in said
        ), said
        assert len(estimates()) == 1

        # past the wait: exit 1 naming the server; the output committed whole, the estimate not recorded
        raw["services"]["mlflow_wait_s"] = 3
        write_config(tmp_path, raw)
        gone["back_after_s"] = None
        capsys.readouterr()
        assert cli_main(predict) == 1
        err = capsys.readouterr().err
        assert f"the MLflow tracking server at {uri} did not answer" in err and "services.mlflow_wait_s" in err, err
        manifest = read_manifest(str(output))
        assert (manifest["rows"], manifest["model"]) == (300, "models:/m/1")
        servers.append(mlflow_server(folder, port))
        assert len(estimates()) == 1
        monkeypatch.setattr(infer, "write_output", committed)
        assert cli_main(predict) == 0 and len(estimates()) == 2
    finally:
        stop(servers[-1])
