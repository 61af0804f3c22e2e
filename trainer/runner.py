"""Build the TorchTrainer from the config: scaling, checkpointing, failure handling, storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray.data
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from preprocessors.tabular import TabularPreprocessor
from trainer.checkpoint import read_metrics
from trainer.loop import TrainValDataConfig, train_fn_per_worker
from trainer.recovery import RecoveryLog


def scaling_config(scaling: dict[str, Any]) -> ScalingConfig:
    """ScalingConfig from the config's `scaling` section."""
    return ScalingConfig(
        num_workers=scaling["num_workers"],
        use_gpu=scaling["use_gpu"],
        resources_per_worker=scaling.get("resources_per_worker"),
        accelerator_type=scaling.get("accelerator_type"),
    )


def run_dir(config: dict[str, Any], run_name: str) -> str:
    """Where Ray Train keeps this run: checkpoints, its state, and trainflow's recovery log."""
    return config["storage_path"].rstrip("/") + "/" + run_name


def latest_epoch(run_path: str) -> int | None:
    """The highest epoch among the run's readable checkpoints, or None for a new run."""
    epochs = []
    for d in Path(run_path).glob("checkpoint_*"):
        try:
            epochs.append(int(read_metrics(d)["epoch"]))
        except (OSError, ValueError, KeyError):
            continue
    return max(epochs, default=None)


def build_trainer(
    config: dict[str, Any],
    preprocessor: TabularPreprocessor,
    train_ds: ray.data.Dataset,
    val_ds: ray.data.Dataset,
    run_name: str,
    storage_filesystem=None,
    train_fn=train_fn_per_worker,
) -> TorchTrainer:
    """A TorchTrainer whose run resumes when built again with the same storage_path and run_name."""
    ckpt = config["checkpoint"]
    return TorchTrainer(
        train_fn,
        train_loop_config={"config": config, "preprocessor": preprocessor.to_dict(), "run_dir": run_dir(config, run_name)},
        scaling_config=scaling_config(config["scaling"]),
        datasets={"train": train_ds, "val": val_ds},
        dataset_config=TrainValDataConfig(),
        run_config=RunConfig(
            name=run_name,
            storage_path=config["storage_path"],
            storage_filesystem=storage_filesystem,
            checkpoint_config=CheckpointConfig(
                num_to_keep=ckpt["num_to_keep"],
                checkpoint_score_attribute=ckpt["metric"],
                checkpoint_score_order=ckpt["mode"],
            ),
            failure_config=FailureConfig(max_failures=config["failure"]["max_failures"]),
            callbacks=[RecoveryLog(run_dir(config, run_name))],
        ),
    )
