"""GPU paths: NCCL training (1 worker), 2 workers sharing one GPU (Gloo: NCCL refuses two ranks on one
device) and GPU batch inference. Skipped without CUDA."""

import json

import pyarrow.dataset as pads
import pytest
import torch

from tests.conftest import churn_config
from trainflow.trainer.serving.servable import load_servable
from trainflow.trainer.serving.predict import predict_table
from trainflow.flows.cli import main as cli_main

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.e2e,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("prefect_harness"),
]


@pytest.fixture(scope="module")
def ray_gpu(own_ray):
    from trainflow.run.runtime import ensure_ray

    ensure_ray(num_cpus=4)  # Ray detects the GPU
    yield


@pytest.mark.parametrize(
    ("workers", "per_worker"),
    [(1, {"CPU": 1, "GPU": 1}), (2, {"CPU": 1, "GPU": 0.5})],
    ids=["nccl-1-worker", "gloo-2-workers-half-gpu"],
)
def test_gpu_training_and_inference(ray_gpu, tmp_path, workers, per_worker):
    cfg = churn_config(
        tmp_path,
        rows=20000,
        scaling={"num_workers": workers, "use_gpu": True, "resources_per_worker": per_worker},
        inference={"use_gpu": True, "num_actors": 1},
    )
    assert cli_main(["retrain", "--config", str(cfg), "--summary-json", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["best_checkpoint"]["metrics"]["val_loss"] < 0.69  # learned something beyond chance
    out = pads.dataset(summary["predictions_path"]).to_table()
    score = pads.dataset(tmp_path / "data" / "score.parquet").to_table()
    assert out.num_rows == score.num_rows
    # GPU inference agrees with the same checkpoint on CPU
    cpu = predict_table(load_servable(summary["best_checkpoint"]["path"]), score, "customer_id")
    import numpy as np

    np.testing.assert_allclose(out["proba_1"].to_numpy(), cpu["proba_1"].to_numpy(), atol=1e-4)
