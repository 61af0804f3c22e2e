"""async-upload: training steps per second while every step reports a checkpoint to an object store, with trainflow's
asynchronous upload (checkpoint.upload async: Ray Train uploads while the next step runs) against the synchronous one
(each report waits for its upload), same run.

The store: moto's S3 server on loopback. The loop: one Ray Train worker (TorchTrainer) whose step is about
STEP_S seconds of torch work, each step reported through trainer/reporting.report_step with a checkpoint of
CHECKPOINT_MB megabytes (the size of a large network's weights and optimizer state). Steps per second: between the
first and the last report of the loop, as the worker sees them; the fit's wall time (with the last upload) is printed
too. Target ratio >= 1.2."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.common import report

STEPS = int(os.environ.get("ASYNC_UPLOAD_STEPS", "8"))
STEP_S = float(os.environ.get("ASYNC_UPLOAD_STEP_S", "1.0"))
CHECKPOINT_MB = int(os.environ.get("ASYNC_UPLOAD_MB", "64"))


def _loop(loop_config: dict) -> None:
    import numpy as np
    import ray.train
    import torch

    from trainflow.trainer.reporting import report_step

    config = loop_config["config"]
    rank = ray.train.get_context().get_world_rank()
    payload = np.random.default_rng(0).bytes(CHECKPOINT_MB * 2**20)
    a = torch.randn(512, 512)
    times = []
    for step in range(STEPS):
        until = time.perf_counter() + STEP_S
        while time.perf_counter() < until:  # the step's work
            a = torch.tanh(a @ a) * 0.5
        times.append(time.perf_counter())
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0

        def write(folder: str) -> None:
            Path(folder, "weights.bin").write_bytes(payload)

        report_step({"step": step, "steps_per_s": rate}, rank, write, config)


def _fit(mode: str, bucket: str) -> tuple[float, float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from trainflow.config import config_from_dict

    config = config_from_dict(
        {
            "data": {"path": "unused.parquet", "label": "y"},
            "task": "regression",
            "storage_path": f"s3://{bucket}/runs",
            "checkpoint": {"upload": mode},
        }
    )
    trainer = TorchTrainer(
        _loop,
        train_loop_config={"config": config},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name=f"upload-{mode}", storage_path=config.storage_path),
    )
    started = time.perf_counter()
    result = trainer.fit()
    return float(result.metrics["steps_per_s"]), time.perf_counter() - started


def main() -> None:
    import pyarrow.fs as pafs

    from tests.conftest import Moto, free_port
    from trainflow.run.runtime import ensure_ray

    moto = Moto(free_port())
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{moto.port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        bucket = "trainflow-bench"
        pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{moto.port}", scheme="http", allow_bucket_creation=True
        ).create_dir(bucket)
        ensure_ray(num_cpus=os.cpu_count())
        time.sleep(5)  # Ray's worker processes start after ray.init: not timed against either side
        sync_rate, sync_wall = _fit("sync", bucket)
        async_rate, async_wall = _fit("async", bucket)
        report(
            "async-upload",
            async_rate,
            sync_rate,
            "steps/s",
            async_rate / sync_rate,
            f"{STEPS} steps of {STEP_S:.1f} s, each reporting a {CHECKPOINT_MB} MB checkpoint to moto's S3 on loopback; "
            f"checkpoint.upload async vs sync; fit wall {async_wall:.1f} s vs {sync_wall:.1f} s",
        )
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
