"""The backtest's arithmetic: a model whose accuracy falls with the age of the rows is said to age, by how much per
month and with what noise; one whose accuracy does not move is said not to."""

import numpy as np

from trainflow.trainer.backtest import backtest, backtest_line, earlier_comparison


def _rows(falls_per_day: float, seed: int = 0):
    """1,200 test rows over 60 days after a cutoff at day 100; row i is right with a chance that falls with its age."""
    rng = np.random.default_rng(seed)
    times = 100 + rng.uniform(0, 60, 1200)
    right = rng.random(1200) < 0.9 - falls_per_day * (times - 100)
    return times, (lambda rows: float(right[rows].mean()))


def test_a_model_that_ages_is_said_to_and_one_that_does_not_is_not():
    times, accuracy = _rows(0.003)
    b = backtest(times, accuracy, 100.0, "day", "accuracy", higher_is_better=True)
    assert len(b["slices"]) == 6 and [s["rows"] for s in b["slices"]] == [200] * 6
    assert b["slices"][0]["age"] < b["slices"][-1]["age"] and b["measurable"]
    assert 0.04 < b["loss_per_unit"] < 0.14 and b["noise"] < 0.04  # 0.003 a day: 0.09 a month
    line = backtest_line(b)
    assert line.startswith("by the test rows' age, accuracy falls about 0.") and "per month" in line
    assert "retrained daily" in line
    flat = backtest(*_rows(0.0, seed=1), 100.0, "day", "accuracy", higher_is_better=True)
    assert not flat["measurable"]
    assert backtest_line(flat).startswith("by the test rows' age, no change of accuracy with the age")
    assert backtest(times[:150], accuracy, 100.0, "day", "accuracy", True) is None  # too few rows for two slices


def test_an_earlier_model_that_scores_worse_on_the_same_rows_says_what_a_month_of_age_costs():
    """Two models on the same 2,000 test rows: the earlier one (cut off 30 days before) is right on 85% of them,
    the recent one on 90%; the rows' own difficulty is shared (a hard row is wrong for both)."""
    rng = np.random.default_rng(3)
    hard = rng.random(2000)
    recent_right, earlier_right = hard < 0.90, hard < 0.85

    def accuracy(right):
        return lambda rows: float(right[rows].mean())

    e = earlier_comparison(accuracy(recent_right), accuracy(earlier_right), 2000, 30.0, "day", higher_is_better=True)
    assert abs(e["recent"] - 0.90) < 0.02 and abs(e["earlier"] - 0.85) < 0.02 and e["measurable"]
    assert abs(e["loss_per_unit"] - 0.05 * 30.4 / 30) < 0.01 and 0 < e["noise"] < 0.01  # paired: a small noise
    line = backtest_line({"metric": "accuracy", "unit": "month", "slices": [], "earlier": e})
    assert line.startswith("the same model cut off 30 days earlier scores accuracy 0.8") and "worse per month" in line
    assert "retrained daily, the serving model is about 0.00" in line
    # a loss (lower is better) that does not move: no claim
    same = earlier_comparison(accuracy(recent_right), accuracy(recent_right), 2000, 30.0, "day", False)
    assert same["loss_per_unit"] == 0 and not same["measurable"]
    assert "a difference the noise cannot tell from none" in backtest_line(
        {"metric": "loss", "unit": "month", "earlier": same, "slices": []}
    )
    assert earlier_comparison(accuracy(recent_right), accuracy(earlier_right), 2000, 0.0, "day", True) is None


def test_the_earlier_fit_is_skipped_with_a_reason_when_asked_too_small_or_out_of_time():
    import time
    from types import SimpleNamespace

    from trainflow.config import config_from_dict
    from trainflow.flows.backtest import backtest_family, fit_earlier

    base = {"data": {"path": "t.parquet", "label": "y"}, "task": "classification", "split": {"time_column": "day"}}
    on, off = config_from_dict(base), config_from_dict({**base, "split": {"time_column": "day", "backtest_fit": False}})
    timed = SimpleNamespace(plan=SimpleNamespace(time_column="day", earlier={"cut": -1.0}))
    small = SimpleNamespace(plan=SimpleNamespace(time_column="day", earlier=None))
    hashed = SimpleNamespace(plan=SimpleNamespace(time_column=None, earlier=None))
    assert (
        fit_earlier(off, off, timed, None, "xgboost", "/ckpt", "r-earlier", None).skipped
        == "split.backtest_fit is false"
    )
    assert fit_earlier(on, on, hashed, None, "xgboost", "/ckpt", "r-earlier", None).skipped == "roles are not by time"
    assert "too few training rows" in fit_earlier(on, on, small, None, "xgboost", "/ckpt", "r-earlier", None).skipped
    late = fit_earlier(on, on, timed, None, "xgboost", "/ckpt", "r-earlier", time.time() + 3.4)
    assert late.earlier is None and late.skipped.startswith("the time budget had 3 s left")
    assert backtest_family("ensemble", {"mlp": 0.3, "catboost": 0.7}) == "catboost"
    assert backtest_family("xgboost", None) == "xgboost"
