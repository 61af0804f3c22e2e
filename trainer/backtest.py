"""How fast a model ages: its metric on the rows it never trained on, by how long after its training data they come.

With roles by time (split.time_column) the test rows are the newest rows, in time order. They are cut into slices of
equal rows; each slice's age is how long after the model's last training time its median row comes, and its metric
the model's on that slice. The slope of metric against age (least squares, in the time column's unit: days for dates
and timestamps) says how much quality is lost per month of age; its noise comes from resampling the rows within each
slice (a bootstrap), so a slope within the noise is said to be one. Plain numpy: no Prefect, MLflow or Ray.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

MIN_SLICE_ROWS = 100  # fewer rows per slice than this and a slice's metric is mostly noise
MAX_SLICES = 6
BOOTSTRAP = 100
MONTH_DAYS = 30.4


def backtest(
    times: np.ndarray,
    metric: Callable[[np.ndarray], float],
    cutoff: float,
    unit: str,
    name: str,
    higher_is_better: bool,
    seed: int = 0,
) -> dict[str, Any] | None:
    """The backtest of one model on its test rows: times (the time_number of each row, in row order), metric(rows)
    its figure on a subset (indices), cutoff the last time it trained on, unit "day" (dates, timestamps: times in
    days) or "unit" (a numeric time column). None when the rows are too few for two slices."""
    order = np.argsort(times, kind="stable")
    slices = min(MAX_SLICES, len(order) // MIN_SLICE_ROWS)
    if slices < 2:
        return None
    parts = np.array_split(order, slices)
    ages = np.array([float(np.median(times[p]) - cutoff) for p in parts])
    values = np.array([metric(p) for p in parts])
    if not np.isfinite(values).all() or np.ptp(ages) <= 0:
        return None
    slope = float(np.polyfit(ages, values, 1)[0])
    rng, draws = np.random.default_rng(seed), []
    for _ in range(BOOTSTRAP):
        resampled = np.array([metric(p[rng.integers(0, len(p), len(p))]) for p in parts])
        if np.isfinite(resampled).all():
            draws.append(float(np.polyfit(ages, resampled, 1)[0]))
    se = float(np.std(draws)) if len(draws) > 1 else float("nan")
    per = MONTH_DAYS if unit == "day" else 1.0
    loss = -slope if higher_is_better else slope  # quality lost per unit of age (positive: the model ages)
    return {
        "metric": name,
        "unit": "month" if unit == "day" else "unit of the time column",
        "slices": [
            {"age": round(a, 3), "rows": int(len(p)), "value": float(v)} for a, p, v in zip(ages, parts, values)
        ],
        "loss_per_unit": loss * per,
        "noise": se * per,
        "loss_per_day": loss if unit == "day" else None,
        "measurable": bool(np.isfinite(se) and abs(loss) > 2 * se),
    }


def time_slices(times: np.ndarray, metric: Callable[[np.ndarray], float]) -> list[dict[str, float]]:
    """The rows in time order cut into up to MAX_SLICES slices of equal rows (at least MIN_SLICE_ROWS each): each
    slice's first and last time, rows and metric."""
    order = np.argsort(times, kind="stable")
    slices = min(MAX_SLICES, len(order) // MIN_SLICE_ROWS)
    if slices < 1:
        return []
    return [
        {"start": float(times[p].min()), "end": float(times[p].max()), "rows": int(len(p)), "value": float(metric(p))}
        for p in np.array_split(order, slices)
    ]


def earlier_comparison(
    recent: Callable[[np.ndarray], float],
    earlier: Callable[[np.ndarray], float],
    rows: int,
    shift: float,
    unit: str,
    higher_is_better: bool,
    seed: int = 0,
) -> dict[str, Any] | None:
    """Two models of one procedure, the earlier cut off `shift` (days, or units of a numeric time column) before
    the recent one, on the same test rows (recent(rows), earlier(rows): each one's metric on a subset): the quality
    the shift costs, per month (per unit), with its noise from resampling the test rows (both models on each draw,
    so the rows' own difficulty cancels). None without rows or a shift."""
    if rows < 2 or not shift > 0:
        return None
    every = np.arange(rows)
    mine, theirs = recent(every), earlier(every)
    if not (np.isfinite(mine) and np.isfinite(theirs)):
        return None
    sign = 1.0 if higher_is_better else -1.0
    rng, draws = np.random.default_rng(seed), []
    for _ in range(BOOTSTRAP):
        pick = rng.integers(0, rows, rows)
        gap = sign * (recent(pick) - earlier(pick))
        if np.isfinite(gap):
            draws.append(gap)
    per = (MONTH_DAYS if unit == "day" else 1.0) / shift
    gap, se = sign * (mine - theirs), float(np.std(draws)) if len(draws) > 1 else float("nan")
    return {
        "recent": float(mine),
        "earlier": float(theirs),
        "shift": float(shift),
        "unit": "month" if unit == "day" else "unit of the time column",
        "loss_per_unit": float(gap * per),
        "noise": float(se * per),
        "loss_per_day": float(gap / shift) if unit == "day" else None,
        "measurable": bool(np.isfinite(se) and abs(gap) > 2 * se),
    }


def _earlier_line(e: dict[str, Any], metric: str) -> str:
    unit = e["unit"]
    shift = f"{e['shift']:.0f} days" if unit == "month" else f"{e['shift']:g} units"
    head = (
        f"the same model cut off {shift} earlier scores {metric} {e['earlier']:.4f} on the test rows against "
        f"{e['recent']:.4f}"
    )
    if not e["measurable"]:
        return (
            f"{head}: a difference the noise cannot tell from none ({e['loss_per_unit']:+.4f} per {unit}, noise "
            f"{e['noise']:.4f})"
        )
    trend = "worse" if e["loss_per_unit"] > 0 else "better"
    line = f"{head}: {abs(e['loss_per_unit']):.4f} {trend} per {unit} of age (noise {e['noise']:.4f})"
    if e.get("loss_per_day") is not None and e["loss_per_unit"] > 0:
        line += (
            f"; retrained daily, the serving model is about {e['loss_per_day']:.4f} behind a fresh one, weekly "
            f"{7 * e['loss_per_day']:.4f}"
        )
    return line


def backtest_line(b: dict[str, Any]) -> str:
    """The backtest in one modest line: the earlier model's comparison where it was fitted, then the test rows by age."""
    unit, metric = b["unit"], b["metric"]
    lines = [_earlier_line(b["earlier"], metric)] if b.get("earlier") else []
    if b.get("earlier_skipped"):
        lines.append(f"no earlier model: {b['earlier_skipped']}")
    if b.get("slices"):
        lines.append(_slices_line(b, unit, metric, claim=not b.get("earlier")))
    return "; ".join(lines)


def _slices_line(b: dict[str, Any], unit: str, metric: str, claim: bool) -> str:
    span = (
        f"over test rows {b['slices'][0]['age']:.0f} to {b['slices'][-1]['age']:.0f} "
        + ("days" if unit == "month" else "units")
        + " after its training data"
    )
    if not b["measurable"]:
        return (
            f"by the test rows' age, no change of {metric} with the age of the data could be told from the noise {span} "
            f"({b['loss_per_unit']:+.4f} per {unit}, noise {b['noise']:.4f})"
        )
    trend = "falls" if b["loss_per_unit"] > 0 else "rises"
    line = (
        f"by the test rows' age, {metric} {trend} about {abs(b['loss_per_unit']):.4f} per {unit} (noise "
        f"{b['noise']:.4f}) {span}"
    )
    if claim and b.get("loss_per_day") is not None and b["loss_per_unit"] > 0:
        line += (
            f"; a model retrained daily is about {b['loss_per_day']:.4f} behind a fresh one, weekly "
            f"{7 * b['loss_per_day']:.4f}"
        )
    return line
