"""Roles by time end to end: a retrain with split.time_column judges on the newest rows and says their time ranges;
the table grows by a month and the next retrain's gate judges both models on rows newer than anything the champion
trained or chose on, saying which."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import daily_table, write_config, write_parquet
from trainflow.flows.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]


def _table(days: int, seed: int = 0) -> pa.Table:
    """8 rows a day over `days` days of 2013; y depends on x, and on the season a little."""
    return daily_table(days, 8, seed, lambda day, x1, x2: x1 + 0.5 * x2 + 0.3 * np.sin(day / 58.0))


def test_a_time_split_judges_the_newest_rows_and_the_gate_those_newer_than_the_champion(tmp_path, capsys):
    full = _table(330)
    write_parquet(full.filter(pa.array(np.repeat(np.arange(330), 8) < 300)), tmp_path / "data" / "train.parquet")
    cfg = write_config(
        tmp_path,
        {
            "data": {"path": "data/train.parquet", "label": "y", "id_column": "id"},
            "task": "classification",
            "split": {"time_column": "when"},
            "model": {"type": "mlp", "params": {"mlp": {"epochs": 2, "batch_size": 64}}},
            "train": {"folds": 1},
            "scaling": {"num_workers": 1},
            "storage_path": "runs",
            "mlflow": {"experiment": "time", "registered_model": "time-model"},
        },
    )
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
    tested = aged["by_time"]["test"]
    assert (tested[0]["start"], tested[-1]["end"], sum(t["rows"] for t in tested)) == ("2013-08-29", "2013-10-27", 480)
    assert "out-of-fold" not in aged["by_time"]  # one split: no out-of-fold rows
    # and the same family cut off one validation block (48 days, 384 rows) earlier, both on the 480 test rows
    e = aged["earlier"]
    assert aged["earlier_family"] == "mlp" and e["run_name"] == f"{s['run_name']}-earlier" and e["shift"] == 48
    assert (e["recent_cutoff"], e["cutoff"]) == ("2013-07-11", "2013-05-24") and 48 < e["age"] < 110
    assert np.isfinite([e["recent"], e["earlier"], e["loss_per_unit"], e["noise"]]).all() and e["noise"] > 0
    assert "the same model cut off 48 days earlier scores loss" in out
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs(client.get_experiment_by_name("time").experiment_id)}
    assert runs[e["run_name"]].info.status == "FINISHED"
    parent = client.get_run(s["mlflow_run_id"])
    assert {"backtest.earlier_loss_per_unit", "backtest.earlier_noise"} <= set(parent.data.metrics)

    # a month more: the test window moves forward; the gate judges on the challenger's test rows, every one newer
    # than what the champion trained or chose on
    write_parquet(full, tmp_path / "data" / "train.parquet")
    second = tmp_path / "second.json"
    assert cli_main(["retrain", "--config", str(cfg), "--summary-json", str(second), "--set", "train.folds=3"]) == 0
    s2 = json.loads(second.read_text())
    promo = s2["promotion"]
    assert promo["champion_version"] == "1" and promo["rows"] == s2["test_rows"] == 528
    assert "split.json" not in promo["reason"]  # the champion's stored plan by time matches its own config
    assert (
        "all newer than what champion v1 trained or chose on (its rows before 2013-08-29)" in promo["judged_rows_note"]
    )
    assert "judged rows" in capsys.readouterr().out
    # cross-fitted by time (3 blocks of 88 days of the 264 non-test days): the newest fold model (fold 0, trained on
    # the two older blocks) against one trained on the oldest block, early-stopped on the middle one
    e2 = s2["backtest"]["earlier"]
    assert s2["folds"] == 3 and e2["run_name"] == f"{s2['run_name']}-earlier" and e2["shift"] == 88
    assert (e2["recent_cutoff"], e2["cutoff"]) == ("2013-06-25", "2013-03-29")  # days 175 and 87 of 2013
    oof = s2["backtest"]["by_time"]["out-of-fold"]  # each block predicted by the fold model that never saw it
    assert (oof[0]["start"], oof[-1]["end"], sum(t["rows"] for t in oof)) == ("2013-01-01", "2013-09-21", 2112)
    assert all(np.isfinite(t["value"]) for t in oof)
