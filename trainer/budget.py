"""The training budget: batch size, epochs and early-stopping patience resolved from the table's size.

A fixed 10 epochs of batch 256 gave a few-hundred-row table about 10 optimizer steps (digits accuracy
0.45 vs 0.98 for HistGradientBoosting). `auto` aims at TARGET_STEPS optimizer steps per worker,
with small tables getting small batches and many epochs, and large ones full-size batches and a few
epochs; early stopping then ends the run once the checkpoint metric stops improving.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
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
    batch_size: int  # per worker
    epochs: int  # the most epochs; early stopping may end sooner
    patience: int | None  # epochs without improvement before stopping; None: never stop early
    steps_per_epoch: int  # per worker
    unit = "epoch"  # what one report's step counts, in progress lines

    @property
    def limit(self) -> int:
        return self.epochs

    def describe(self) -> str:
        return (
            f"batch size {self.batch_size} per worker, up to {self.epochs} epoch(s) ({self.steps_per_epoch} step(s) "
            "each); early stopping "
            + (f"after {self.patience} epoch(s) without improvement" if self.patience else "off")
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "unit": self.unit, "limit": self.limit, "description": self.describe()}


def resolve_budget(train: TrainSection, train_rows: int, num_workers: int) -> Budget:
    """The budget for train_rows split over num_workers (0, Ray Train's local mode, counts as 1)."""
    per_worker = max(1, train_rows // max(1, num_workers))
    batch = train.batch_size
    if batch == "auto":
        batch = 2 ** math.floor(math.log2(max(1.0, per_worker / ROWS_PER_STEP)))
        batch = int(min(MAX_BATCH, max(MIN_BATCH, batch)))
    steps = max(1, math.ceil(per_worker / batch))
    epochs = train.epochs
    if epochs == "auto":
        epochs = int(min(MAX_AUTO_EPOCHS, max(MIN_AUTO_EPOCHS, math.ceil(TARGET_STEPS / steps))))
    patience = train.early_stopping.patience
    if patience == "auto":
        patience = max(MIN_PATIENCE, epochs // PATIENCE_SHARE)
    elif patience == "off":
        patience = None
    return Budget(batch_size=int(batch), epochs=int(epochs), patience=patience, steps_per_epoch=steps)


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
