"""gbdt-parity: trainflow's xgboost family (XGBoostTrainer, 1 worker of 2 CPUs) vs xgboost.train in one process.

Same 2M-row x 16-column table packed by the same fitted preprocessor, same parameters (hist, depth 6,
learning rate 0.1, 2 threads), same rounds, both evaluating the training and validation sets every
round. Compared: the time of every boosting round after the first (trainflow's includes its reports:
a validation pass and a checkpoint at most every checkpoint.min_interval_s). XGBoostTrainer's start-up
and the worker reading its shard are printed apart.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np

from bench.common import COLS, ROWS, make_table

ROUNDS = 60
THREADS = 2


def run_trainflow(path, storage: str):
    import ray

    from trainflow.trainer.serving.checkpoint import read_metrics
    from trainflow.trainer.runner import build_trainer
    from trainflow.config import config_from_dict
    from trainflow.data import arrow_schema, read_table
    from trainflow.preprocessors.fit import fit_and_pack
    from trainflow.tables.files import table_spec
    from trainflow.run.runtime import ensure_ray

    ensure_ray(num_cpus=THREADS)
    cfg = config_from_dict(
        {
            "data": {"path": str(path), "label": "y"},
            "task": "regression",
            "model": {
                "type": "xgboost",
                "params": {"num_boost_round": ROUNDS, "early_stopping_rounds": "off", "max_depth": 6},
            },
            "scaling": {"num_workers": 1, "resources_per_worker": {"CPU": THREADS}},
            "checkpoint": {"num_to_keep": 1},
            "failure": {"max_failures": 0},
            "storage_path": storage,
        }
    )
    ds, _, _ = read_table(cfg.data.path, "parquet")
    spec = table_spec(arrow_schema(ds, str(path)), cfg.data, cfg.task, str(path))
    prep, train, val = fit_and_pack(ds.limit(ROWS - 20_000), ds.limit(20_000), spec, cfg.task)
    arrays = [
        np.concatenate(parts)
        for parts in zip(
            *[(b["features"], b["label"]) for b in train.iter_batches(batch_size=None, batch_format="numpy")]
        )
    ]
    varrays = [
        np.concatenate(parts)
        for parts in zip(
            *[(b["features"], b["label"]) for b in val.iter_batches(batch_size=None, batch_format="numpy")]
        )
    ]
    t0 = time.perf_counter()
    result = build_trainer(cfg, prep, train, val, "gbdt-parity").fit()
    wall = time.perf_counter() - t0
    ray.shutdown()
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
    from trainflow.trainer.families import family_named

    params = family_named("xgboost").library_params(prep, cfg)
    return [h["epoch_time_s"] for h in history], wall, params, arrays, varrays


def run_plain(params, arrays, varrays) -> list[float]:
    import xgboost as xgb

    dtrain = xgb.DMatrix(arrays[0], label=arrays[1], nthread=-1)
    dval = xgb.DMatrix(varrays[0], label=varrays[1], nthread=-1)
    times, last = [], [time.perf_counter()]

    class Clock(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log) -> bool:
            now = time.perf_counter()
            times.append(now - last[0])
            last[0] = now
            return False

    last[0] = time.perf_counter()
    xgb.train(
        params,
        dtrain,
        num_boost_round=ROUNDS,
        evals=[(dtrain, "train"), (dval, "val")],
        verbose_eval=False,
        callbacks=[Clock()],
    )
    return times


def main() -> None:
    path = make_table()
    with tempfile.TemporaryDirectory() as storage:
        ours, wall, params, arrays, varrays = run_trainflow(path, storage)
    plain = run_plain(params, arrays, varrays)
    a, b = sum(ours[1:]), sum(plain[1:])
    print(
        f"gbdt-parity: trainflow {a:.2f} s, baseline {b:.2f} s, ratio {a / b:.2f}  ({ROWS - 20_000} rows x {COLS} cols, "
        f"{ROUNDS} rounds, seconds for rounds 2-{ROUNDS}; median round {np.median(ours[1:]):.3f} vs {np.median(plain[1:]):.3f} s; "
        f"first round {ours[0]:.2f} vs {plain[0]:.2f} s; XGBoostTrainer.fit wall {wall:.1f} s incl. start-up and reading the shard)",
        flush=True,
    )


if __name__ == "__main__":
    main()
