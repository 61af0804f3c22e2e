"""Tables larger than Ray's object store stream from their files; a stalled run fails with a clear message."""

import json
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from tests.conftest import write_config, write_parquet
from tests.faults import small_run, stall_after_blocks
from trainflow.trainer.runner import build_trainer, fit_run, run_dir
from trainflow.flows.cli import main as cli_main
from trainflow.errors import TrainingError
from trainflow.run.runtime import ensure_ray
from trainflow.data import streamed_task_args

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("own_ray")]

STORE = 75 * 2**20  # Ray's object store for this module (its minimum)
ROWS = 600_000  # 84 MB in memory (79 MB the store): more than the store holds


def _table(rows: int, seed: int, label: bool = True) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 32)).astype(np.float32)
    cols = {"id": np.arange(rows) + seed * 10_000_000, **{f"f{i}": x[:, i] for i in range(32)}}
    if label:
        cols["y"] = (x[:, :3].sum(axis=1) + 0.1 * rng.normal(size=rows)).astype(np.float32)
    return pa.table(cols)


@pytest.mark.usefixtures("prefect_harness")
def test_a_table_larger_than_the_object_store_streams_from_its_files(tmp_path):
    import ray

    ray.shutdown()  # a Ray this module's other test started has Ray's default store, not the smallest one
    ensure_ray(num_cpus=2, object_store_memory=STORE)
    write_parquet(_table(ROWS, 1), tmp_path / "data" / "train.parquet")
    score = _table(100_000, 2, label=False)
    write_parquet(score, tmp_path / "data" / "score.parquet")
    cfg = write_config(
        tmp_path,
        {
            "data": {"path": "data/train.parquet", "label": "y", "id_column": "id"},
            "task": "regression",
            # plain inputs: periodic embeddings (auto up to 1M rows) triple a step, and streaming is what is under test
            "model": {"type": "mlp", "params": {"mlp": {"numeric_embedding": "none", "epochs": 1, "batch_size": 1024}}},
            "train": {"folds": 1},
            "scaling": {"num_workers": 2},
            "checkpoint": {"metric": "val_rmse", "min_interval_s": 0},
            "storage_path": "runs",
            "mlflow": {"experiment": "stream", "registered_model": "stream-test"},
            "inference": {"input": "data/score.parquet", "output": "out/predictions", "batch_size": 65536},
        },
    )
    summary_path = tmp_path / "summary.json"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "big", "--summary-json", str(summary_path)]) == 0
    summary = json.loads(summary_path.read_text())
    # chosen from the files' metadata against the object store: nothing of the table was materialized
    assert summary["data_materialized"] is False
    assert summary["data_fingerprint"].startswith("metadata:")  # not a second full read of the table
    assert summary["train_rows"] + summary["validation_rows"] + summary["test_rows"] == ROWS
    # the test role is capped at 50,000 rows (the rest trains); validation is a fifth of the other rows
    assert abs(summary["test_rows"] - 50_000) < 1_000
    assert abs(summary["validation_rows"] / (ROWS - summary["test_rows"]) - 0.2) < 0.01
    assert summary["epochs_run"] == 1 and summary["best_checkpoint"]["metrics"]["val_r2"] > 0.9
    # every scoring row predicted, in input order, without materializing the scoring table either
    out = pads.dataset(summary["predictions_path"]).to_table(columns=["id"])
    assert summary["output_rows"] == summary["input_rows"] == out.num_rows == score.num_rows
    assert out["id"].to_pylist()[:5] == score["id"].to_pylist()[:5]
    assert out["id"].to_pylist()[-5:] == score["id"].to_pylist()[-5:]


@pytest.mark.timeout(240)
def test_a_stalled_data_pipeline_fails_with_what_ran_out_and_what_to_change(tmp_path):
    ensure_ray(num_cpus=2)
    cfg, prep, train, val = small_run(tmp_path, hang_timeout_s=5.0, max_failures=0)
    stalled = (
        train.repartition(8)
        .materialize()
        .map_batches(
            stall_after_blocks,
            fn_kwargs={"marker": str(tmp_path / "block"), "passes": 8},
            batch_size=None,
            # as trainflow's streamed tasks: no CPU asked (one asking never runs beside the workers), as many at once
            # as the cluster has CPUs (unbounded, each block would start a Ray worker process of its own)
            **streamed_task_args(),
        )
    )
    trainer = build_trainer(cfg, prep, stalled, val, "stalled", streamed=True)
    with pytest.raises(TrainingError) as err:
        fit_run(trainer, run_dir(cfg, "stalled"), 2, "auto")
    message = str(err.value)
    assert "no progress" in message and "hang_timeout_s=5" in message
    assert "data.materialize: never" in message and "scaling.num_workers" in message
