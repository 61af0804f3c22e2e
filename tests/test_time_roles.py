"""Roles by time end to end: a retrain with split.time_column judges on the newest rows and says their time ranges;
the table grows by a month and the next retrain's gate judges both models on rows newer than anything the champion
trained or chose on, saying which."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import write_config, write_parquet
from trainflow.flows.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]


def _table(days: int, seed: int = 0) -> pa.Table:
    """8 rows a day over `days` days of 2013; y depends on x, and on the season a little."""
    rng = np.random.default_rng(seed)
    n = days * 8
    day = np.repeat(np.arange(days), 8)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    y = ((x1 + 0.5 * x2 + 0.3 * np.sin(day / 58.0) + rng.normal(0, 0.5, n)) > 0).astype(np.int64)
    return pa.table({"id": np.arange(n), "when": pa.array([dt.date(2013, 1, 1) + dt.timedelta(days=int(d)) for d in day]),
                     "x1": x1, "x2": x2, "y": y})


def test_a_time_split_judges_the_newest_rows_and_the_gate_those_newer_than_the_champion(tmp_path, capsys):
    full = _table(330)
    write_parquet(full.filter(pa.array(np.repeat(np.arange(330), 8) < 300)), tmp_path / "data" / "train.parquet")
    cfg = write_config(tmp_path, {
        "data": {"path": "data/train.parquet", "label": "y", "id_column": "id"}, "task": "classification",
        "split": {"time_column": "when"}, "model": {"type": "mlp"},
        "train": {"epochs": 2, "batch_size": 64, "folds": 1}, "scaling": {"num_workers": 1},
        "storage_path": "runs", "mlflow": {"experiment": "time", "registered_model": "time-model"},
    })
    first = tmp_path / "first.json"
    assert cli_main(["retrain", "--config", str(cfg), "--summary-json", str(first)]) == 0
    s = json.loads(first.read_text())
    assert s["split"].startswith("by time ('when')") and "test: 2013-08-29 to 2013-10-27, 480 rows" in s["split"]
    assert s["test_rows"] == 480 and s.get("split_note") is None  # the newest 60 days of 300
    assert "newest" in s["promotion"]["judged_rows_note"]
    out = capsys.readouterr().out
    assert "roles             by time ('when')" in out
    # the backtest: the chosen model's promotion.metric (val_loss) on 4 slices of its 480 test rows by their age
    aged = s["backtest"]
    assert aged["metric"] == "loss" and [p["rows"] for p in aged["slices"]] == [120] * 4
    # ages count from the last training row: validation (48 days) lies between it and the test rows
    assert 40 < aged["slices"][0]["age"] < aged["slices"][-1]["age"] < 115 and "backtest          " in out

    # a month more: the test window moves forward; the gate judges on the challenger's test rows, every one newer
    # than what the champion trained or chose on
    write_parquet(full, tmp_path / "data" / "train.parquet")
    second = tmp_path / "second.json"
    assert cli_main(["retrain", "--config", str(cfg), "--summary-json", str(second)]) == 0
    s2 = json.loads(second.read_text())
    promo = s2["promotion"]
    assert promo["champion_version"] == "1" and promo["rows"] == s2["test_rows"] == 528
    assert "split.json" not in promo["reason"]  # the champion's stored plan by time matches its own config
    assert "all newer than what champion v1 trained or chose on (its rows before 2013-08-29)" in promo["judged_rows_note"]
    assert "judged rows" in capsys.readouterr().out
