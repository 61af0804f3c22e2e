"""Remote storage through pyarrow.fs against a local S3 server (moto) on 127.0.0.1.

Read the table from s3://, keep Ray Train's checkpoints in s3:// and resume from them (after the store went away
mid-training), write the predictions to s3://.
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient
from prefect.artifacts import Artifact

from tests.conftest import BUCKET, write_config
from trainflow.flows.cli import main as cli_main
from trainflow.errors import DataError
from trainflow.tables.outputs import read_manifest
from trainflow.tables.sample import make_churn_table

pytestmark = pytest.mark.e2e

SENTINELS = ("uri-secret-5f1e9a", "env-secret-77c2d1", "runtime-secret-0b3e44")


@pytest.fixture(scope="module")
def ray_with_s3(s3_endpoint, own_ray):
    """A local Ray started after the AWS settings exist, so every worker inherits them."""
    from trainflow.run.runtime import ensure_ray

    ensure_ray(num_cpus=2)
    yield


def _check_recorded(summary: dict, tmp_path, fs: pafs.FileSystem) -> None:
    """The registry, MLflow and Prefect say what the gate decided and where the model came from (its run in S3)."""
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert str(client.get_model_version_by_alias("s3-test", "champion").version) == "1"
    v1 = client.get_model_version("s3-test", "1")
    assert v1.tags["trainflow.promotion.decision"] == summary["promotion"]["decision"] == "promoted"
    assert v1.tags["trainflow.data_fingerprint"] == summary["data_fingerprint"]
    assert v1.tags["trainflow.run_name"] == "s3-run"
    assert v1.tags["trainflow.ray_run_path"] == summary["ray_run_path"]
    assert v1.tags["trainflow.prefect_flow_run_id"]
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.tags["trainflow.promotion.reason"] == summary["promotion"]["reason"]
    assert "loss_curve.png" in [a.path for a in client.list_artifacts(run.info.run_id)]
    # what a person looks at in Prefect: the model card, the per-epoch metrics table and the loss curve
    card = Artifact.get("s3-test-model-card")
    assert "## Calibration" in card.data and "## Slices of the test rows" in card.data
    assert "promoted" in card.data and summary["data_fingerprint"] in card.data and summary["ray_run_path"] in card.data
    table = json.loads(Artifact.get("s3-test-epoch-metrics").data)
    assert [row["epoch"] for row in table] == list(range(5))  # the resumed run's history: each epoch once
    # the curve embedded (a browser renders data: images, not s3://), and also written beside the run
    curve = Artifact.get("s3-test-loss-curve")
    assert curve.data.startswith("data:image/png;base64,") and curve.data in card.data
    assert f"{summary['ray_run_path']}/loss_curve.png" in curve.description
    png = base64.b64decode(curve.data.split(",", 1)[1])
    assert png.startswith(b"\x89PNG") and fs.get_file_info(
        f"{summary['ray_run_path']}/loss_curve.png".removeprefix("s3://")
    ).size == len(png)


def _upload(fs: pafs.FileSystem, table, key: str) -> str:
    with fs.open_output_stream(f"{BUCKET}/{key}") as f:
        pq.write_table(table, f)
    return f"s3://{BUCKET}/{key}"


def _stop_once_registered(moto_server, fs: pafs.FileSystem, run: str):
    """A thread that stops moto once Ray Train has registered the run's first checkpoint in S3; its Event says it did."""
    import threading
    import time

    stopped = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not stopped.is_set():
            if fs.get_file_info(f"{BUCKET}/runs/{run}/checkpoint_manager_snapshot.json").type == pafs.FileType.File:
                moto_server.stop()
                stopped.set()
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, stopped


@pytest.mark.usefixtures("prefect_harness", "ray_with_s3")
def test_read_checkpoint_resume_and_predict_in_s3(moto_server, s3_endpoint, tmp_path, capsys):
    """The store away mid-training for longer than the run waits (moto stopped once the first checkpoint is
    registered): exit 1 naming the store and its wait, nothing registered or written; the same command with the store
    back resumes from that checkpoint, completes, registers version 1 and writes the predictions in the bucket."""
    fs = s3_endpoint
    _upload(fs, make_churn_table(2000, seed=1), "data/train/part-0.parquet")
    score = make_churn_table(300, seed=2, with_label=False, id_offset=10_000)
    score_uri = _upload(fs, score, "data/score.parquet")
    # secrets where users put them: worker env vars, Ray's runtime_env, credentials inside a URI (moto accepts any)
    cfg = write_config(
        tmp_path,
        {
            "data": {
                "path": f"s3://sentinel-key:{SENTINELS[0]}@{BUCKET}/data/train/",
                "label": "churned",
                "id_column": "customer_id",
            },
            "task": "classification",
            "model": {"type": "mlp", "params": {"mlp": {"epochs": 5, "batch_size": 16, "learning_rate": 0.005}}},
            "train": {"folds": 1},  # epochs of about a second
            "checkpoint": {"min_interval_s": 0},  # each epoch its own report and checkpoint, however short
            "scaling": {"num_workers": 1, "env_vars": {"AWS_SESSION_TOKEN_X": SENTINELS[1]}},
            "ray": {"runtime_env": {"env_vars": {"MY_API_TOKEN": SENTINELS[2]}}},
            "failure": {"max_failures": 0},
            "services": {"storage_wait_s": 2},
            "storage_path": f"s3://{BUCKET}/runs",
            "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "registered_model": "s3-test"},
            "inference": {"input": score_uri, "output": f"s3://{BUCKET}/predictions/churn"},
        },
    )
    watcher, stopped = _stop_once_registered(moto_server, fs, "s3-run")
    capsys.readouterr()
    try:
        code = cli_main(["retrain", "--config", str(cfg), "--run-name", "s3-run"])
    finally:
        stopped.set()
        watcher.join(5)
        moto_server.start()
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    assert f"the object store at http://127.0.0.1:{moto_server.port}" in err and "services.storage_wait_s" in err, err[
        -3000:
    ]
    assert not [secret for secret in SENTINELS if secret in err]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.search_model_versions("name = 's3-test'") == []
    assert fs.get_file_info(f"{BUCKET}/predictions").type == pafs.FileType.NotFound
    with fs.open_input_stream(f"{BUCKET}/runs/s3-run/checkpoint_manager_snapshot.json") as f:
        stopped_at = max(r["metrics"]["epoch"] for r in json.loads(f.read())["checkpoint_results"])
    assert stopped_at < 4, "the run ended before the store went away"

    summary_path = tmp_path / "s.json"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "s3-run", "--summary-json", str(summary_path)]) == 0
    first = json.loads(summary_path.read_text())
    assert stopped_at < first["resumed_from_epoch"] < 5 and first["epochs_run"] == 5 and first["model_version"] == "1"
    assert first["data_path"] == f"s3://***@{BUCKET}/data/train/"
    assert first["ray_run_path"] == f"s3://{BUCKET}/runs/s3-run"
    assert first["best_checkpoint"]["uri"].startswith(f"s3://{BUCKET}/runs/s3-run/checkpoint_")
    kept = [
        i.base_name
        for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/runs/s3-run"))
        if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_")
    ]
    with fs.open_input_stream(f"{BUCKET}/runs/s3-run/checkpoint_manager_snapshot.json") as f:
        snapshot = json.loads(f.read())
    registered = {r["checkpoint_dir_name"] for r in snapshot["checkpoint_results"]}
    registered |= {snapshot["latest_checkpoint_result"]["checkpoint_dir_name"]}
    assert first["best_checkpoint"]["uri"].rsplit("/", 1)[1] in registered
    assert 3 <= len(registered) <= 4  # num_to_keep + the latest
    # checkpoints to S3 upload while training goes on (checkpoint.upload auto): every registered one is whole (its
    # model and metrics read back), and the workers' local copies were removed once uploaded
    for name in registered:
        with fs.open_input_stream(f"{BUCKET}/runs/s3-run/{name}/metrics.json") as f:
            assert json.loads(f.read())["epoch"] >= 0
        assert fs.get_file_info(f"{BUCKET}/runs/s3-run/{name}/model.pt").type == pafs.FileType.File
    # (and what the attempt the store's absence stopped had left unuploaded, by the next attempt's start)
    from trainflow.trainer.reporting import local_checkpoint_prefix

    assert not list(Path(tempfile.gettempdir()).glob(local_checkpoint_prefix(first["ray_run_path"]) + "*"))
    # nothing beside them: the checkpoint the stopped attempt's worker was writing when the store went away (Ray's
    # controller never registered it), and any of that attempt's that Ray dropped without deleting, were removed
    assert set(kept) == registered, (kept, registered)
    out = pads.dataset(f"{BUCKET}/predictions/churn", filesystem=fs).to_table()
    assert out.num_rows == first["output_rows"] == score.num_rows
    assert sorted(out["customer_id"].to_pylist()) == sorted(score["customer_id"].to_pylist())

    _check_recorded(first, tmp_path, fs)
    # the predictions follow their manifest: one generation, named by it, nothing staged beside it
    leftovers = [
        i.base_name for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/predictions")) if i.base_name != "churn"
    ]
    assert leftovers == []
    manifest = read_manifest(f"s3://{BUCKET}/predictions/churn")
    assert manifest["model"] == "models:/s3-test/1" and manifest["rows"] == score.num_rows
    assert [
        i.base_name
        for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/predictions/churn"))
        if i.type == pafs.FileType.Directory
    ] == [manifest["generation"]]
    _no_secret_written(fs, tmp_path, capsys)


def _no_secret_written(fs: pafs.FileSystem, tmp_path, capsys) -> None:
    """No sentinel in anything trainflow wrote: the bucket, the MLflow store, the summary, Prefect's logs and
    artifacts, the terminal."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter

    blobs = {}
    for info in fs.get_file_info(pafs.FileSelector(BUCKET, recursive=True)):
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                blobs[f"s3://{info.path}"] = f.read()
    for p in tmp_path.rglob("*"):
        if p.is_file() and p.name != "config.yaml":  # the user's own config holds them, of course
            blobs[str(p)] = p.read_bytes()
    out = capsys.readouterr()
    blobs["terminal"] = (out.out + out.err).encode()
    with get_client(sync_client=True) as client:
        blobs["prefect logs"] = "\n".join(log.message for log in client.read_logs(LogFilter(), limit=200)).encode()
    for key in ("s3-test-model-card", "s3-test-epoch-metrics"):
        blobs[key] = str(Artifact.get(key).data).encode()
    assert len(blobs) > 20
    for secret in SENTINELS:
        found = [name for name, data in blobs.items() if secret.encode() in data]
        assert not found, f"{secret} written to {found}"


@pytest.mark.usefixtures("prefect_harness", "ray_with_s3")
def test_object_store_outputs_commit_with_a_manifest_and_queue_their_writers(s3_endpoint):
    import threading

    import ray.data

    import trainflow.tables.outputs as outputs

    fs, out = s3_endpoint, f"s3://{BUCKET}/out/preds"

    def table(rows):
        return ray.data.from_arrow(pa.table({"id": np.arange(rows), "p": np.full(rows, float(rows))}))

    assert outputs.write_output(table(10), out, 10, {"model": "v1"}) == 10
    first = outputs.read_manifest(out)
    # a write that fails, and a crash that left an unfinished generation: readers following the manifest see the
    # complete previous output; the next write removes the unfinished one
    with pytest.raises(DataError, match="wrote 4 rows for 5"):
        outputs.write_output(table(4), out, 5, {"model": "v2"})
    assert outputs.read_manifest(out) == first
    orphan = f"{BUCKET}/out/preds/gen-20260101T000000-0123456789ab"
    with fs.open_output_stream(f"{orphan}/part-0.parquet") as f:
        f.write(b"half a file")
    assert pq.read_table(outputs.output_files(out), filesystem=fs).num_rows == 10
    # two writers at once queue on the output's lock: one complete output, never both merged
    threads = [
        threading.Thread(target=outputs.write_output, args=(table(n), out, n, {"model": f"w{n}"})) for n in (7, 9)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    manifest = outputs.read_manifest(out)
    gens = [
        i.base_name
        for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/out/preds"))
        if i.type == pafs.FileType.Directory
    ]
    assert gens == [manifest["generation"]]
    got = pads.dataset(f"{BUCKET}/out/preds", filesystem=fs).to_table()
    assert got.num_rows == manifest["rows"] in (7, 9) and set(got["p"].to_pylist()) == {float(manifest["rows"])}
    # an object-store folder of someone else's is never replaced
    with fs.open_output_stream(f"{BUCKET}/theirs/data.csv") as f:
        f.write(b"a,b\n")
    with pytest.raises(DataError, match="holds files trainflow did not write"):
        outputs.write_output(table(3), f"s3://{BUCKET}/theirs", 3, {})
    with fs.open_input_stream(f"{BUCKET}/theirs/data.csv") as f:
        assert f.read() == b"a,b\n"


@pytest.mark.usefixtures("prefect_harness")
def test_retention_in_a_bucket_removes_only_recorded_runs_and_keeps_one_in_progress(s3_endpoint, tmp_path):
    """Retention with storage_path in S3: of three recorded runs (trainflow's own record_start) and keep_runs 1, the
    oldest goes whole (every object under its folders, its done record and its record), the middle one stays while a
    start of it holds its run-name lock, the newest stays; what no run recorded stays, and a run-named folder of
    another storage_path is not this one's to judge. (The folders' contents stand in for checkpoints: what retention
    reads is their names and sizes.)"""
    import time

    from trainflow.config import config_from_dict
    from trainflow.run.locks import run_lock
    from trainflow.retention import LEDGER, collect, record_start

    fs, storage = s3_endpoint, f"s3://{BUCKET}/kept-runs"
    config = config_from_dict(
        {
            "data": {"path": "unused.parquet", "label": "y"},
            "task": "regression",
            "storage_path": storage,
            "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "registered_model": "kept"},
            "retention": {"keep_runs": 1},
        }
    )
    for name in ("old", "middle", "new"):
        record_start(config, name)
        for entry in (f"{name}-families/{name}-xgboost/fold0/model.json", f"{name}-split/assignment.parquet"):
            with fs.open_output_stream(f"{BUCKET}/kept-runs/{entry}") as f:
                f.write(b"x" * 1000)
        with fs.open_output_stream(f"{BUCKET}/kept-runs/{name}-done.json") as f:
            f.write(b"{}")
        time.sleep(1.1)  # starts a second apart: the records order them
    with fs.open_output_stream(f"{BUCKET}/kept-runs/unrecorded-split/mine.txt") as f:
        f.write(b"not trainflow's")
    with run_lock(storage, "middle", wait=False):
        done = collect(config)
    assert [r["run"] for r in done["removed"]] == ["old"] and done["removed"][0]["bytes"] == 2002
    assert sorted(done["removed"][0]["entries"]) == ["old-done.json", "old-families", "old-split"]
    why = {k["run"]: k["why"] for k in done["kept"]}
    assert why == {"new": "one of the newest 1 (retention.keep_runs)", "middle": why["middle"]}
    assert "in progress" in why["middle"]
    left = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/kept-runs")))
    assert left == [
        LEDGER, "middle-done.json", "middle-families", "middle-split", "new-done.json", "new-families", "new-split",
        "unrecorded-split",
    ]  # fmt: skip
    assert sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/kept-runs/{LEDGER}"))) == [
        "middle.json",
        "new.json",
    ]
    # with nothing in progress the middle one goes too
    assert [r["run"] for r in collect(config)["removed"]] == ["middle"]
