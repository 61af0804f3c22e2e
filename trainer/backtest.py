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


def backtest(times: np.ndarray, metric: Callable[[np.ndarray], float], cutoff: float, unit: str,
             name: str, higher_is_better: bool, seed: int = 0) -> dict[str, Any] | None:
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
        "metric": name, "unit": "month" if unit == "day" else "unit of the time column",
        "slices": [{"age": round(a, 3), "rows": int(len(p)), "value": float(v)} for a, p, v in zip(ages, parts, values)],
        "loss_per_unit": loss * per, "noise": se * per, "loss_per_day": loss if unit == "day" else None,
        "measurable": bool(np.isfinite(se) and abs(loss) > 2 * se),
    }


def backtest_line(b: dict[str, Any]) -> str:
    """The backtest in one modest line."""
    unit, metric = b["unit"], b["metric"]
    span = f"over test rows {b['slices'][0]['age']:.0f} to {b['slices'][-1]['age']:.0f} " + \
        ("days" if unit == "month" else "units") + " after its training data"
    if not b["measurable"]:
        return (f"no change of {metric} with the age of the data could be told from the noise {span} "
                f"({b['loss_per_unit']:+.4f} per {unit}, noise {b['noise']:.4f})")
    trend = "falls" if b["loss_per_unit"] > 0 else "rises"
    line = f"{metric} {trend} about {abs(b['loss_per_unit']):.4f} per {unit} of age (noise {b['noise']:.4f}) {span}"
    if b.get("loss_per_day") is not None and b["loss_per_unit"] > 0:
        line += (f"; a model retrained daily is about {b['loss_per_day']:.4f} behind a fresh one, weekly "
                 f"{7 * b['loss_per_day']:.4f}")
    return line
