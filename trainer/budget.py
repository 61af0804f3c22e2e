"""The training budget: batch size, epochs and early-stopping patience resolved from the table's size.

A fixed 10 epochs of batch 256 gave a few-hundred-row table about 10 optimizer steps (digits accuracy
0.45 vs 0.98 for HistGradientBoosting). `auto` aims at TARGET_STEPS optimizer steps per worker,
with small tables getting small batches and many epochs, and large ones full-size batches and a few
epochs; early stopping then ends the run once the checkpoint metric stops improving. Also what every torch
family's AdamW shares: its learning-rate factor per step and whether its fused kernel applies (fusable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainflow.config import TrainSection
from trainflow.limits import (
    MAX_AUTO_EPOCHS,
    MAX_BATCH,
    MIN_AUTO_EPOCHS,
    MIN_BATCH,
    MIN_PATIENCE,
    PATIENCE_SHARE,
    ROWS_PER_STEP,
    TARGET_STEPS,
)


@dataclass(frozen=True)
class Budget:
    """What one fit may spend, for every family: at most `limit` steps of its `unit` (the network's epochs, a
    booster's rounds), early stopping after `patience` steps without improvement (None: never); the network's batch
    size and steps per epoch (per worker); whether a booster's workers read their shard into an external-memory
    matrix (XGBoost, xgboost_extmem.py)."""

    unit: str  # "epoch", "round" (a booster's) or another family's step (its name, e.g. "tree"), in progress lines
    limit: int
    patience: int | None
    batch_size: int | None = None
    steps_per_epoch: int | None = None
    external_memory: bool = False

    def describe(self) -> str:
        if self.unit != "epoch":
            noun = "boosting round" if self.unit == "round" else self.unit
            return f"up to {self.limit} {noun}(s); early stopping " + (
                f"after {self.patience} {self.unit}(s) without a lower validation loss" if self.patience else "off"
            )
        return (
            f"batch size {self.batch_size} per worker, up to {self.limit} epoch(s) ({self.steps_per_epoch} step(s) "
            "each); early stopping "
            + (f"after {self.patience} epoch(s) without improvement" if self.patience else "off")
        )

    def to_dict(self) -> dict[str, Any]:
        """The record (summary, MLflow params, a finished run's file) under each unit's own names: epochs and
        patience, or num_boost_round and early_stopping_rounds; another unit's under its limit and patience."""
        if self.unit == "round":
            own = {
                "num_boost_round": self.limit,
                "early_stopping_rounds": self.patience,
                "external_memory": self.external_memory,
            }
        elif self.unit != "epoch":
            own = {"patience": self.patience}
        else:
            own = {
                "batch_size": self.batch_size,
                "epochs": self.limit,
                "patience": self.patience,
                "steps_per_epoch": self.steps_per_epoch,
            }
        return {**own, "unit": self.unit, "limit": self.limit, "description": self.describe()}


def resolve_budget(train: TrainSection, train_rows: int, num_workers: int, world_size: int | None = None) -> Budget:
    """The budget for train_rows split over num_workers (0, Ray Train's local mode, counts as 1).

    world_size: the workers an attempt of an elastic run got, when not num_workers (the planned count, its maximum).
    The global batch (per-worker batch x workers) and so the steps per epoch, the epochs and the learning-rate
    schedule stay those of the planned count: each worker's batch grows as the group shrinks (rounded to whole
    rows), so a resize changes how the work is spread, not the optimisation."""
    planned = max(1, num_workers)
    per_worker = max(1, train_rows // planned)
    batch = train.batch_size
    if batch == "auto":
        batch = 2 ** math.floor(math.log2(max(1.0, per_worker / ROWS_PER_STEP)))
        batch = int(min(MAX_BATCH, max(MIN_BATCH, batch)))
    steps = max(1, math.ceil(per_worker / batch))
    if world_size is not None and max(1, world_size) != planned:
        batch = max(1, round(batch * planned / max(1, world_size)))
        steps = max(1, math.ceil(max(1, train_rows // max(1, world_size)) / batch))
    epochs = train.epochs
    if epochs == "auto":
        epochs = int(min(MAX_AUTO_EPOCHS, max(MIN_AUTO_EPOCHS, math.ceil(TARGET_STEPS / steps))))
    patience = train.early_stopping.patience
    if patience == "auto":
        patience = max(MIN_PATIENCE, epochs // PATIENCE_SHARE)
    elif patience == "off":
        patience = None
    return Budget("epoch", int(epochs), patience, batch_size=int(batch), steps_per_epoch=steps)


def lr_factor(step: int, total_steps: int, warmup_fraction: float, schedule: str) -> float:
    """The learning-rate multiplier at an optimizer step: linear warm-up, then cosine decay or constant."""
    warmup = max(1, int(warmup_fraction * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class EarlyStopping:
    """Tracks the best value of a metric; plain data, so it is saved in every checkpoint and resumed."""

    mode: str
    patience: int | None
    min_delta: float
    best: float | None = None
    best_epoch: int | None = None
    bad_epochs: int = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record an epoch's value; True when it is a new best."""
        if not math.isfinite(value):
            improved = False
        elif self.best is None:
            improved = True
        elif self.mode == "min":
            improved = value < self.best - self.min_delta
        else:
            improved = value > self.best + self.min_delta
        if improved:
            self.best, self.best_epoch, self.bad_epochs = float(value), epoch, 0
        else:
            self.bad_epochs += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_epochs >= self.patience

    def state(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "bad_epochs": self.bad_epochs}

    def load(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch, self.bad_epochs = state["best"], state["best_epoch"], int(state["bad_epochs"])


def fusable(params) -> bool | None:
    """True where PyTorch's fused AdamW takes every parameter (floating point, on CPU or CUDA: the same update in one
    kernel per step, training-parity in docs/performance.md), else None (AdamW's own choice)."""
    params = list(params)
    return (bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)) or None
