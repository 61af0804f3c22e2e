"""tune-parallelism: wall time of a 4-trial sweep with trials running concurrently vs one at a time.

Each trial is a TorchTrainer run (1 worker, 1 CPU) on the same small table; the sweep's
concurrency is what trainflow derives from the cluster (here: one trial per core).
"""

from __future__ import annotations

import os
import tempfile
import time

from bench.common import report, start_ray

TRIALS = 4


def sweep(storage: str, name: str, max_concurrent: int | None) -> tuple[float, int]:
    import ray.data

    from trainflow.tasks.tune import concurrency
    from tests.conftest import make_regression_table
    from trainflow.trainer.tune import build_tuner
    from trainflow.config import config_from_dict
    from trainflow.preprocessors.fit import fit_and_pack
    from trainflow.tables.files import table_spec

    table = make_regression_table(20_000)
    cfg = config_from_dict(
        {
            "data": {"path": "mem", "label": "target y", "id_column": "row id"},
            "task": "regression",
            "model": {"type": "mlp", "params": {"mlp": {"epochs": 2, "batch_size": 256}}},
            "scaling": {"num_workers": 1},
            "checkpoint": {"num_to_keep": 1},
            "storage_path": storage,
            "tune": {
                "num_samples": TRIALS,
                "max_concurrent_trials": max_concurrent,
                "scheduler": "fifo",
                "search_space": {"model.params.mlp.learning_rate": {"loguniform": [0.001, 0.01]}},
            },
        }
    )
    train, val = ray.data.from_arrow(table.slice(0, 16_000)), ray.data.from_arrow(table.slice(16_000))
    prep, train, val = fit_and_pack(train, val, table_spec(table.schema, cfg.data, "regression", "mem"), "regression")
    parallel = concurrency(cfg)
    t0 = time.perf_counter()
    results = build_tuner(cfg.to_dict(), prep, train, val, name, parallel).fit()
    wall = time.perf_counter() - t0
    assert len(results) == TRIALS and not results.errors, results.errors
    return wall, parallel


def main() -> None:
    import ray

    start_ray()
    with tempfile.TemporaryDirectory() as storage:
        serial, _ = sweep(storage, "serial", 1)
        concurrent, parallel = sweep(storage, "concurrent", None)
    ray.shutdown()
    report(
        "tune-parallelism",
        concurrent,
        serial,
        "s",
        serial / concurrent,
        f"{TRIALS} trials of a 1-worker TorchTrainer, 2 epochs; {parallel} at a time on {os.cpu_count()} CPUs vs 1 at a time; ratio = speed-up",
    )


if __name__ == "__main__":
    main()
