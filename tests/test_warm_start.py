"""train.warm_start's refusals, each a fresh fit with its reason (the continuation itself: tests/test_replay.py's
warm policy, XGBoost continuing the model it serves)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import empty_mlflow_store, tiny_preprocessor
from trainflow.config import config_from_dict
from trainflow.errors import ConfigError
from trainflow.tasks.warm import _same_schema, resolve_warm, summary_record, warm_source


def _config(tmp_path, warm_start: str, **train):
    import shutil

    shutil.copyfile(empty_mlflow_store(), tmp_path / "mlflow.db")
    return config_from_dict(
        {
            "data": {"path": "t.parquet", "label": "y"},
            "task": "classification",
            "model": {"type": "xgboost"},
            "train": {"warm_start": warm_start, **train},
            "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "registered_model": "m"},
        },
        base_dir=tmp_path,
    )


def test_none_resolves_nothing_and_champion_names_the_alias(tmp_path):
    prep = tiny_preprocessor()
    assert resolve_warm(_config(tmp_path, "none"), prep, 1) == (prep, None)
    assert warm_source(_config(tmp_path, "champion")) == "models:/m@champion"
    assert warm_source(_config(tmp_path, "models:/other/3")) == "models:/other/3"
    with pytest.raises(ConfigError, match="warm_start"):
        _config(tmp_path, "yesterday")
    # a continuation is another fit (never a skip of the champion's own rows); none leaves every hash as it was
    for family in ("xgboost", "mlp"):
        plain = _config(tmp_path, "none").training_hash(family)
        assert _config(tmp_path, "champion").training_hash(family) != plain


def test_a_bag_and_a_missing_champion_give_a_fresh_fit_with_the_reason(tmp_path):
    prep = tiny_preprocessor()
    same, record = resolve_warm(_config(tmp_path, "champion"), prep, 5)
    assert same is prep and "train.folds 5: the challenger is a bag of fold models" in record["fresh"]
    same, record = resolve_warm(_config(tmp_path, "champion"), prep, 1)
    assert (
        same is prep and record["fresh"].startswith("no model to start from") and record["from"] == "models:/m@champion"
    )
    assert summary_record({**record, "files": {"model.ubj": b"x"}}) == record


def test_another_schema_is_refused_naming_what_differs():
    mine = tiny_preprocessor()
    assert _same_schema(mine, mine) is None
    fewer = dataclasses.replace(mine, feature_order=mine.feature_order[:3])
    assert "feature_order differs" in _same_schema(mine, fewer)
    other_classes = dataclasses.replace(mine, classes=["no", "maybe"])
    assert "classes differs" in _same_schema(mine, other_classes)


@pytest.mark.usefixtures("prefect_harness")
def test_the_test_figures_of_a_warm_start_leave_out_the_rows_its_source_trained_on(tmp_path):
    """A continued model learnt from its source's training rows: where the source's split did not hold out every
    test row of this one (here its test role is half as wide, as when the table grew under rank cuts), every
    candidate's test figures read only the rows the source held out, and the summary says so."""
    import numpy as np
    import pyarrow as pa
    from prefect import flow

    from tests.conftest import tiny_checkpoint, tiny_table
    from trainflow.roles.folds import TEST, FoldPlan
    from trainflow.tasks.final_score import score_test
    from trainflow.tasks.values import Selected
    from trainflow.trainer.evaluate import score_checkpoint

    table = tiny_table(400)
    table = table.append_column("y", pa.array(np.where(np.arange(400) % 3 == 0, "yes", "no")))
    ckpt = str(tiny_checkpoint(tmp_path))
    cfg = config_from_dict(
        {"data": {"path": "t.parquet", "label": "y", "id_column": "id"}, "task": "classification"}, base_dir=tmp_path
    )
    mine = FoldPlan(seed=7, key_columns=("id",), test_fraction=0.2, validation_fraction=0.2, label="y")
    source = dataclasses.replace(mine, test_fraction=0.1)
    chosen = {"mlp": Selected(ckpt, 0, {}, [])}

    @flow
    def scored(warm_plan):
        return score_test(cfg, table, chosen, "mlp", mine, warm_plan=warm_plan)

    kept = source.held_out(table)
    assert 0 < kept.sum() < 400 and not source.holds_out_every_test_row_of(mine)
    tested = scored(source)
    assert tested.rows == kept.sum() and len(tested.chosen.labels) == 400  # the gate's side keeps every row
    expected = score_checkpoint(ckpt, table).subset(kept).metrics()
    assert tested.metrics["mlp"]["test_loss"] == pytest.approx(expected["val_loss"])
    assert tested.note.startswith(f"{kept.sum()} of the 400 test rows: those the warm start's source never")
    # a source that held out every test row (the nightly case: the same split) changes nothing
    same = scored(mine)
    assert same.rows == 400 and same.note is None
    # a source split by a column this table lacks: every row, and the figures say they may hold its rows
    elsewhere = scored(dataclasses.replace(source, key_columns=("account",)))
    assert elsewhere.rows == 400 and elsewhere.note.startswith("all 400 test rows: the warm start's source split")
    assert "account" in elsewhere.note
    assert summary_record({"from": "models:/m@champion", "family": "mlp", "files": {}, "plan": mine.to_dict()}) == {
        "from": "models:/m@champion",
        "family": "mlp",
    }
    # by time: the backtest's figures (the test rows' slices in time order) read the same rows only
    timed_table = tiny_table(2000).append_column("t", pa.array(np.arange(2000) / 2.0))
    timed_table = timed_table.append_column("y", pa.array(np.where(np.arange(2000) % 3 == 0, "yes", "no")))
    by_time = dict(time_column="t", time_kind="number", key_columns=(), label=None, time_ranges={"train": (0.0, 599.5)})
    mine = dataclasses.replace(mine, cuts={"": [-800.0, -600.0]}, **by_time)  # test: t > 800, 399 rows
    source = dataclasses.replace(mine, cuts={"": [-900.0, -600.0]})  # test: t > 900, 199 rows

    timed_table = timed_table.filter(pa.array(mine.roles(timed_table) == TEST))  # what score_test is given

    @flow
    def scored_by_time(warm_plan):
        return score_test(cfg, timed_table, chosen, "mlp", mine, warm_plan=warm_plan)

    kept = source.held_out(timed_table)
    assert kept.sum() == 199 and not source.holds_out_every_test_row_of(mine)
    slices = scored_by_time(source).backtest["by_time"]["test"]
    assert sum(s["rows"] for s in slices) == 199 and min(float(s["start"]) for s in slices) > 900
    assert sum(s["rows"] for s in scored_by_time(mine).backtest["by_time"]["test"]) == 399


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_lightgbm_continues_its_source_booster_and_the_network_its_weights_at_a_tenth_of_the_rate(tmp_path):
    """train.warm_start's continuations as tasks/warm.py ships them (the source checkpoint's files in the loop's
    config): LightGBM adds its rounds after the source's (init_model), the network starts from the source's weights
    with WARM_LR_FACTOR times its learning rate. (CatBoost's: tests/test_families.py; XGBoost's, through a replay's
    warm policy: tests/test_replay.py.)"""
    import json
    from pathlib import Path

    from tests.faults import fit_here, small_run
    from trainflow.config import trial_config
    from trainflow.trainer.serving.checkpoint import read_metrics, read_warm
    from trainflow.trainer.loop import WARM_LR_FACTOR
    from trainflow.trainer.serving.servable import load_servable

    cfg, prep, train, val = small_run(tmp_path)

    def shipped(result, family: str) -> dict:
        with result.checkpoint.as_directory() as d:
            files = {f.name: f.read_bytes() for f in Path(d).iterdir() if f.is_file()}
            epoch = json.loads((Path(d) / "train_state.json").read_text())["epoch"] if family != "mlp" else None
        offset = {} if epoch is None else {"offset": epoch + 1}
        return {"from": f"models:/{family}/1", "version": "1", "family": family, "files": files, **offset}

    boosters = {"model.type": "lightgbm", "scaling.num_workers": 1, "model.params.early_stopping_rounds": "off"}
    source = fit_here(
        trial_config(cfg.to_dict(), {**boosters, "model.params.num_boost_round": 20}), prep, train, val, "lgb-source"
    )
    more = trial_config(cfg.to_dict(), {**boosters, "model.params.num_boost_round": 10})
    again = fit_here(more, prep, train, val, "lgb-warm", warm_start=shipped(source, "lightgbm"))
    with again.checkpoint.as_directory() as d:
        assert read_warm(d) == {"from": "models:/lightgbm/1", "version": "1", "offset": 20}
        assert load_servable(d).predict.booster.num_trees() == 30  # the source's 20 trees, then this fit's 10
    assert again.metrics["val_loss"] <= source.metrics["val_loss"] * 1.05

    network = {"scaling.num_workers": 1, "model.params.mlp.epochs": 2, "checkpoint.min_interval_s": 0}
    first = fit_here(trial_config(cfg.to_dict(), network), prep, train, val, "mlp-source")
    warm = fit_here(
        trial_config(cfg.to_dict(), network), prep, train, val, "mlp-warm", warm_start=shipped(first, "mlp")
    )
    with first.checkpoint.as_directory() as d:
        fresh = read_metrics(d)["history"]
    with warm.checkpoint.as_directory() as d:
        continued = read_metrics(d)["history"]
        assert read_warm(d)["from"] == "models:/mlp/1"
    # the same schedule at a tenth of the rate, from weights that already fit: its first epoch beats a fresh first one
    assert continued[0]["learning_rate"] == pytest.approx(fresh[0]["learning_rate"] * WARM_LR_FACTOR)
    assert continued[0]["val_loss"] < fresh[0]["val_loss"]
