"""Task: the final scoring. Each candidate's selected checkpoint, as it serves, on the test rows: read here and by
the gate, explain and the slices only, after every choice (early stopping, the family, ensemble weights,
calibration, the threshold) was made on other rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.data import Rows
from trainflow.config import Config
from trainflow.tasks.common import retry_unless_user_error
from trainflow.tasks.select import Selected
from trainflow.trainer.evaluate import Scored, score_checkpoint


@dataclass
class TestScores:
    rows: int
    metrics: dict[str, dict[str, float]]  # family -> test_loss, test_accuracy, ... (the validation metrics' names)
    chosen: Scored  # the chosen checkpoint's outputs on every test row, with the slice columns (the gate's side)


def test_names(metrics: dict[str, Any]) -> dict[str, float]:
    """val_loss -> test_loss, ...: the same metric measured on the test rows."""
    return {("test_" + k[4:] if k.startswith("val_") else k): float(v) for k, v in metrics.items()
            if isinstance(v, (int, float))}


@task(name="score-test", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error,
      cache_policy=NO_CACHE)
def score_test(config: Config, test: Rows, selections: dict[str, Selected], chosen: str) -> TestScores:
    """Every candidate's test metrics (the chosen one as it serves, calibration applied; the others as trained), and
    the chosen one's scored test rows."""
    metrics, chosen_scored = {}, None
    for family, selected in selections.items():
        scored = score_checkpoint(selected.path, test, tuple(config.promotion.slices) if family == chosen else ())
        metrics[family] = test_names(scored.metrics()) if len(scored.labels) else {}
        if family == chosen:
            chosen_scored = scored
    rows = len(chosen_scored.labels)
    get_run_logger().info("test rows (%d, untouched by every choice): %s", rows, ", ".join(
        f"{f} {config.promotion.metric.replace('val_', 'test_', 1)}="
        f"{m.get(config.promotion.metric.replace('val_', 'test_', 1), float('nan')):.4g}" for f, m in metrics.items()))
    return TestScores(rows, metrics, chosen_scored)
