"""Task: the final scoring. Each candidate's selected checkpoint, as it serves, on the test rows: read here and by
the gate, explain and the slices only, after every choice (early stopping, the family, ensemble weights,
calibration, the threshold) was made on other rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.data import Rows, column_names
from trainflow.config import Config
from trainflow.tasks.common import retry_unless_user_error
from trainflow.tasks.values import Selected, EarlierFit
from trainflow.roles.folds import FoldPlan
from trainflow.trainer.backtest import backtest, backtest_line, earlier_comparison, time_slices
from trainflow.trainer.evaluate import Scored, score_checkpoint


@dataclass
class TestScores:
    rows: int
    metrics: dict[str, dict[str, float]]  # family -> test_loss, test_accuracy, ... (the validation metrics' names)
    chosen: Scored  # the chosen checkpoint's outputs on every test row, with the slice columns (the gate's side)
    backtest: dict[str, Any] | None = None  # roles by time: the chosen model's metric by the age of the test rows
    note: str | None = None  # why the figures read fewer rows than the test role holds (a warm start's source)


def test_names(metrics: dict[str, Any]) -> dict[str, float]:
    """val_loss -> test_loss, ...: the same metric measured on the test rows."""
    return {
        ("test_" + k[4:] if k.startswith("val_") else k): float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float))
    }


@task(
    name="score-test",
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def score_test(
    config: Config,
    test: Rows,
    selections: dict[str, Selected],
    chosen: str,
    plan: FoldPlan | None = None,
    earlier: EarlierFit | None = None,
    oof: Scored | None = None,
    warm_plan: FoldPlan | None = None,
) -> TestScores:
    """Every candidate's test metrics (the chosen one as it serves, calibration applied; the others as trained), and
    the chosen one's scored test rows; by time (plan), its backtest (trainer/backtest.py): by the test rows' age, and
    the earlier model (flows/backtest.py) against the recent one on the test rows, and the metric by time on the
    rows no model that scored them trained on (the test rows; cross-fitted, the out-of-fold rows: oof). warm_plan: the
    split a warm start's source was trained under; where it did not hold out every test row (the table grew, or
    another split), every candidate's figures read only the test rows it held out, so none is a row the continued
    model learnt from (the gate's comparison with @champion is its own: tasks/promote.py)."""
    metrics, chosen_scored = {}, None
    timed = plan is not None and plan.time_column is not None and (plan.time_ranges or {}).get("train")
    extra = (plan.time_column,) if timed and plan.time_column not in config.promotion.slices else ()
    mask = (
        warm_plan
        if warm_plan is not None and (plan is None or not warm_plan.holds_out_every_test_row_of(plan))
        else None
    )
    lacking = [c for c in mask.columns() if c not in column_names(test)] if mask is not None else []
    if lacking:  # which rows the source held out cannot be told: every row, and the figures say so
        mask = None
    judged = None
    for family, selected in selections.items():
        columns = (*config.promotion.slices, *extra) if family == chosen else ()
        scored = score_checkpoint(selected.path, test, tuple(columns), held_out=mask)
        mine = scored.subset(scored.held_out) if mask is not None else scored
        metrics[family] = test_names(mine.metrics()) if len(mine.labels) else {}
        if family == chosen:
            chosen_scored, judged = scored, len(mine.labels)
    rows = len(chosen_scored.labels)
    note = None
    if mask is not None:
        note = (
            f"{judged} of the {rows} test rows: those the warm start's source never trained or chose on (its split "
            "held out the others' rows differently)"
        )
    elif lacking:
        note = (
            f"all {rows} test rows: the warm start's source split its rows by {', '.join(lacking)}, which this table "
            "lacks, so the rows it trained or chose on cannot be left out (these figures may include some)"
        )
    if note:
        get_run_logger().warning("test figures on %s", note)
    aged = None
    keep = chosen_scored.held_out if mask is not None else None  # a warm start: by time too, only rows it held out
    shown = chosen_scored if keep is None else chosen_scored.subset(keep)
    if timed and len(shown.labels):
        times = _times(shown, plan)  # the test rows' times, read once for every measure below
        aged = _backtest(config, shown, plan, times) or {
            "metric": config.promotion.metric.removeprefix("val_"),
            "slices": [],
            "unit": "unit of the time column" if plan.time_kind == "number" else "month",
        }
        aged["by_time"] = {
            "test": _by_time(config, shown, plan, times),
            **({"out-of-fold": _by_time(config, oof, plan, _times(oof, plan))} if oof is not None else {}),
        }
        if earlier is not None:
            aged.update(earlier_family=earlier.family, **_compared(config, test, earlier, plan, times, keep))
    for column in extra:  # read for the backtest only: the gate's slices are the ones asked for
        chosen_scored.columns.pop(column, None)
    if aged:
        get_run_logger().info("backtest: %s", backtest_line(aged))
    get_run_logger().info(
        "test rows (%d, untouched by every choice): %s",
        rows if judged is None else judged,
        ", ".join(
            f"{f} {config.promotion.metric.replace('val_', 'test_', 1)}="
            f"{m.get(config.promotion.metric.replace('val_', 'test_', 1), float('nan')):.4g}"
            for f, m in metrics.items()
        ),
    )
    return TestScores(rows if judged is None else judged, metrics, chosen_scored, aged, note)


def _times(scored: Scored, plan: FoldPlan) -> np.ndarray:
    """The time_number of each of scored's rows (its time column: raw values, or an Arrow column)."""
    import pyarrow as pa

    from trainflow.roles.folds import time_number

    raw = scored.columns[plan.time_column]
    return time_number(raw.combine_chunks() if isinstance(raw, pa.ChunkedArray) else pa.array(list(raw)))


def _day_scale(plan: FoldPlan) -> float:
    """What divides a time_number difference into days (timestamps count seconds), or units of a numeric column."""
    return 86400.0 if plan.time_kind == "timestamp" else 1.0


def _backtest(config: Config, scored: Scored, plan: FoldPlan, times: np.ndarray) -> dict[str, Any] | None:
    """The chosen model's promotion.metric by the age of its test rows (times) after its last training time."""
    scale = _day_scale(plan)
    times, cutoff = times / scale, plan.time_ranges["train"][1] / scale
    name = config.promotion.metric

    def metric(rows):
        return float(scored.metrics(rows).get(name, float("nan")))

    return backtest(
        times,
        metric,
        cutoff,
        "unit" if plan.time_kind == "number" else "day",
        name.removeprefix("val_"),
        config.promotion.mode == "max",
        config.split.seed,
    )


def _by_time(config: Config, scored: Scored, plan: FoldPlan, times: np.ndarray) -> list[dict[str, Any]]:
    """promotion.metric on slices of scored's rows in time order (times: theirs), each with its time range as the
    column writes it."""
    name = config.promotion.metric
    return [
        {**s, "start": plan.time_text(s["start"]), "end": plan.time_text(s["end"])}
        for s in time_slices(times, lambda rows: float(scored.metrics(rows).get(name, float("nan"))))
    ]


def _compared(
    config: Config, test: Rows, earlier: EarlierFit, plan: FoldPlan, times: np.ndarray, keep: np.ndarray | None = None
) -> dict[str, Any]:
    """{"earlier": the comparison} of the earlier and the recent model on the test rows (times: theirs; keep: the
    ones a warm start's source held out, None: every one), or {"earlier_skipped": why}. Both as trained: calibration
    is fitted for the served model only, and a comparison of a calibrated with an uncalibrated model would count the
    calibration as age."""
    if earlier.earlier is None or earlier.recent is None:
        return {"earlier_skipped": earlier.skipped or "not trained"}
    name = config.promotion.metric
    recent, old = (score_checkpoint(path, test, calibrated=False) for path in (earlier.recent, earlier.earlier))
    if keep is not None:
        recent, old = recent.subset(keep), old.subset(keep)
    days = plan.time_kind != "number"
    scale = _day_scale(plan)
    shift = earlier.shift / scale
    age = float(np.median(times) - plan.earlier["recent_end"]) / scale
    compared = earlier_comparison(
        lambda rows: float(recent.metrics(rows).get(name, float("nan"))),
        lambda rows: float(old.metrics(rows).get(name, float("nan"))),
        len(recent.labels),
        shift,
        "day" if days else "unit",
        config.promotion.mode == "max",
        config.split.seed,
    )
    if compared is None:
        return {"earlier_skipped": "its metric on the test rows could not be computed"}
    return {
        "earlier": {
            **compared,
            "age": age,
            "run_name": earlier.run_name,
            "cutoff": plan.time_text(plan.earlier["end"]),
            "recent_cutoff": plan.time_text(plan.earlier["recent_end"]),
        }
    }
