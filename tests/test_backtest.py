"""The backtest's arithmetic: a model whose accuracy falls with the age of the rows is said to age, by how much per
month and with what noise; one whose accuracy does not move is said not to."""

import numpy as np

from trainflow.trainer.backtest import backtest, backtest_line


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
    assert line.startswith("accuracy falls about 0.") and "per month of age" in line and "retrained daily" in line
    flat = backtest(*_rows(0.0, seed=1), 100.0, "day", "accuracy", higher_is_better=True)
    assert not flat["measurable"] and backtest_line(flat).startswith("no change of accuracy with the age")
    assert backtest(times[:150], accuracy, 100.0, "day", "accuracy", True) is None  # too few rows for two slices
