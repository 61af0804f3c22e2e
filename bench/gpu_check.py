"""GPU proof of trainflow's trainer and predictor (not a benchmark, not part of `make bench`).

Needs only Ray, torch, pyarrow, pandas, scikit-learn and pydantic (no Prefect or MLflow), so it runs on
a GPU machine where the project's full environment cannot be installed:

    CASES=nccl-1-worker,gloo-2-workers-half-gpu python -m bench.gpu_check

Per case: a 20k-row classification table with a 2,000-value text column (embedded) and an ISO
timestamp column (date parts) is split, preprocessed and trained with `use_gpu`, then the best
checkpoint predicts 2,000 rows (100 with an unseen value) on the GPU, directly and through Ray Data
actors, and both are compared with the CPU predictions. WORKER_ENV (JSON) adds worker env vars.
"""

import os
import time
import json
import tempfile
import numpy as np
import pyarrow as pa
import torch
import ray
import ray.data
from trainflow.config import config_from_dict
from trainflow.data import split_roles
from trainflow.roles.plan import plan_split
from trainflow.roles.folds import TRAIN, VALIDATION
from trainflow.preprocessors.fit import check_text_columns, fit_and_pack
from trainflow.tables.files import table_spec
from trainflow.trainer.runner import build_trainer
from trainflow.trainer.serving.servable import load_servable
from trainflow.trainer.serving.predict import predict_table, predict_dataset
from trainflow.run.runtime import TRAIN_ENV_DEFAULTS, LOCAL_TRAIN_ENV_DEFAULTS

print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0), flush=True)
ray.init(
    address="local",
    num_cpus=8,
    include_dashboard=False,
    runtime_env={"env_vars": {**TRAIN_ENV_DEFAULTS, **LOCAL_TRAIN_ENV_DEFAULTS}},
)
print("ray resources", ray.cluster_resources(), flush=True)
rng = np.random.default_rng(0)
n = 20000
codes = np.array([f"C{i:04d}" for i in range(2000)], dtype=object)
code = codes[rng.integers(0, 2000, n)]
effect = {c: rng.normal() for c in codes}
x = rng.normal(size=n)
stamp = np.datetime64("2024-01-01T00:00") + rng.integers(0, 365 * 24, n).astype("timedelta64[h]")
hour = stamp.astype("datetime64[h]").astype(np.int64) % 24
logit = 1.5 * x + np.array([effect[c] for c in code]) + (hour >= 12) * 1.0 - 0.5
y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
table = pa.table(
    {"id": np.arange(n), "x": x, "code": pa.array(code), "when": pa.array(stamp.astype(str).tolist()), "y": y}
)
score = (
    table.slice(0, 2000).drop_columns(["y"]).set_column(2, "code", pa.array(["NEW"] * 100 + code[100:2000].tolist()))
)
results = {}
CASES = [
    ("nccl-1-worker", 1, {"CPU": 1, "GPU": 1}),
    ("gloo-2-workers-half-gpu", 2, {"CPU": 1, "GPU": 0.5}),
    ("cpu-2-workers", 2, {"CPU": 1}),
]
for name, workers, per in [
    c for c in CASES if c[0] in os.environ.get("CASES", "nccl-1-worker,gloo-2-workers-half-gpu").split(",")
]:
    t0 = time.time()
    cfg = config_from_dict(
        {
            "data": {"path": "mem", "label": "y", "id_column": "id"},
            "task": "classification",
            "model": {"type": "mlp"},
            "scaling": {
                "num_workers": workers,
                "use_gpu": "GPU" in per,
                "resources_per_worker": per,
                "env_vars": json.loads(os.environ.get("WORKER_ENV", "{}")),
            },
            "failure": {"hang_timeout_s": 40},
            "storage_path": tempfile.mkdtemp(prefix="runs-"),
        }
    )
    spec = table_spec(table.schema, cfg.data, "classification", "mem")
    ds = ray.data.from_arrow(table)
    check_text_columns(ds, spec, True, "mem")
    parts = split_roles(
        ds, plan_split(ds, "classification", "y", 0.0, 0.2, 42, spec.feature_order + ["y"], rows=0), True
    )
    train, val = parts[TRAIN], parts[VALIDATION]
    prep, tr, va = fit_and_pack(train, val, spec, "classification", cfg.preprocess)
    trainer = build_trainer(cfg, prep, tr, va, f"gpu-{name}", cache_shards=os.environ.get("CACHE", "1") == "1")
    result = trainer.fit()
    best = min(result.best_checkpoints, key=lambda cm: cm[1]["val_loss"])
    ckpt_path = best[0].path
    history = json.load(open(f"{ckpt_path}/metrics.json"))["history"]
    gpu = load_servable(ckpt_path, "cuda")
    dev = next(gpu.model.parameters()).device
    out_gpu = predict_table(gpu, score, "id")
    out_cpu = predict_table(load_servable(ckpt_path), score, "id")
    diff = float(np.abs(out_gpu["proba_1"].to_numpy() - out_cpu["proba_1"].to_numpy()).max())
    actors = predict_dataset(
        ray.data.from_arrow(score), ckpt_path, "id", prep.feature_order, num_actors=1, use_gpu=True
    ).to_arrow_refs()
    out_actor = pa.concat_tables(ray.get(actors))
    diff_actor = float(np.abs(out_actor["proba_1"].to_numpy() - out_cpu["proba_1"].to_numpy()).max())
    results[name] = {
        "seconds": round(time.time() - t0, 1),
        "epochs_run": len(history),
        "best": {k: round(v, 4) for k, v in best[1].items() if isinstance(v, float)},
        "embedded": {c: len(s["categories"]) for c, s in prep.embedded.items()},
        "dates": list(prep.dates),
        "model_device": str(dev),
        "gpu_vs_cpu_max_abs_diff": diff,
        "gpu_actor_vs_cpu_max_abs_diff": diff_actor,
        "rows_out": out_actor.num_rows,
    }
    print(name, json.dumps(results[name]), flush=True)
    assert best[1]["val_loss"] < 0.69 and diff < 1e-4 and diff_actor < 1e-4 and out_actor.num_rows == score.num_rows
print("GPU CHECK OK", flush=True)
