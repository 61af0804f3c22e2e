"""train.time_limit: one deadline shared out over every family's and fold's run; a run whose share is spent stops
with its best so far (the network after an epoch, the boosters after a round), and a family that cannot start in time
is left out with the reason."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import churn_config, tiny_preprocessor
from tests.faults import fit_here, small_run
from trainflow.config import apply_overrides, config_from_dict, trial_config
from trainflow.errors import ConfigError
from trainflow.trainer.serving.checkpoint import read_metrics
from trainflow.trainer.deadline import (
    AUTO_FLOOR_S,
    MIN_RUN_S,
    TIME_LIMITED,
    Deadline,
    TimeShare,
    deadline_board,
    fit_board,
    set_deadline,
)
from trainflow.trainer.runner import run_dir


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_family_may_use_the_time_left_over_its_own_runs_and_a_late_family_is_left_out():
    clock = Clock()
    share = TimeShare(120.0, ["catboost", "lightgbm", "mlp"], at_once=2, clock=clock)
    # 5 fold runs of the first family, two at a time: 3 waves may share all 120 s (what it leaves goes to the next)
    assert share.run_deadline(5) == pytest.approx(1000 + 120 / 3)
    assert share.run_deadline(1) == pytest.approx(1000 + 120)
    clock.now += 100  # 20 s left for the next family's 5 runs: 3 waves of ~7 s, too short to start them
    why = share.too_late("lightgbm", 5)
    assert why and "train.time_limit 120 s: 20 s were left" in why and f"under the {MIN_RUN_S:.0f} s" in why
    assert share.too_late("lightgbm", 1) is None  # one run may have all 20 s
    assert share.too_late("catboost", 5) is None  # the first family always trains: a run ends with a model
    clock.now += 30  # past the limit: a run still gets a deadline (now), never a negative share
    assert share.run_deadline(1) == pytest.approx(clock.now)
    assert share.record()["training_s"] == 130.0


def test_auto_gives_the_other_families_the_first_familys_time_and_off_gives_no_deadline():
    clock = Clock()
    share = TimeShare("auto", ["mlp", "xgboost"], at_once=1, clock=clock)
    assert share.run_deadline(2) is None and share.too_late("xgboost", 1) is None
    clock.now += 2 * AUTO_FLOOR_S  # the network took 600 s: XGBoost gets 600 s more, the run at most twice the first's
    assert share.first_family_ended() and not share.first_family_ended()  # once
    assert share.run_deadline(1) == pytest.approx(clock.now + 2 * AUTO_FLOOR_S)
    assert "mlp trained in 600 s" in share.why and share.record()["first_family_s"] == 600.0
    quick = TimeShare("auto", ["mlp", "xgboost"], at_once=1, clock=clock)
    clock.now += 5  # a small table: all of the training may take the floor, so every family trains
    quick.first_family_ended()
    assert quick.run_deadline(1) == pytest.approx(clock.now + AUTO_FLOOR_S - 5)
    middle = TimeShare("auto", ["mlp", "xgboost"], at_once=1, clock=clock)
    clock.now += 0.6 * AUTO_FLOOR_S  # past half the floor: the others get as long as the first took
    middle.first_family_ended()
    assert middle.run_deadline(1) == pytest.approx(clock.now + 0.6 * AUTO_FLOOR_S)
    off = TimeShare("off", ["mlp", "xgboost"], at_once=1, clock=clock)
    assert not off.first_family_ended() and off.run_deadline(1) is None


def test_the_limit_is_validated_and_never_changes_the_training_hash(tmp_path):
    base = {"data": {"path": "x.parquet", "label": "y"}, "task": "classification"}
    for bad in (0, -5, "soon"):
        with pytest.raises(ConfigError, match="train.time_limit"):
            config_from_dict({**base, "train": {"time_limit": bad}})
    cfg = config_from_dict({**base, "train": {"time_limit": 90}})
    assert cfg.train.time_limit == 90 and config_from_dict(base).train.time_limit == "auto"
    # a rerun under another limit resumes the same runs
    assert cfg.training_hash("xgboost") == config_from_dict(base).training_hash("xgboost")


@pytest.mark.usefixtures("ray_local")
def test_a_deadline_is_asked_of_the_drivers_board_and_a_missing_or_bad_one_is_none(tmp_path):
    clock = Clock()
    set_deadline(str(tmp_path), 1010.0, "train.time_limit 60 s")
    # a fit in this process asks the process's own deadlines; a worker group's board starts holding every one set
    here = Deadline(fit_board(True), str(tmp_path), clock=clock)
    assert not here.passed() and here.passed(margin_s=10.0) and here.why == "train.time_limit 60 s"
    board = fit_board(False)
    assert board is deadline_board() and fit_board(False) is board  # one per process
    d = Deadline(board, str(tmp_path), clock=clock)
    assert not d.passed() and d.passed(margin_s=10.0) and d.why == "train.time_limit 60 s"
    clock.now = 1010.0
    assert d.passed()
    # the second of three folds left in a run: a third of the time left when it starts
    clock.now = 1000.0
    assert Deadline(board, str(tmp_path), clock=clock, share=3).passed(margin_s=10.0 / 3 + 0.01)
    set_deadline(str(tmp_path), float("nan"), "")
    assert not Deadline(board, str(tmp_path), clock=clock).passed()
    assert not Deadline(board, str(tmp_path / "none"), clock=clock).passed()  # no deadline set for that run
    assert not Deadline(None, str(tmp_path), clock=clock).passed()  # no board: a fit outside the retrain flow
    # a board that died (its node left the cluster) is replaced by the next deadline set, not a failed retrain
    import ray

    ray.kill(board)
    _until_dead(board)  # (ray.kill returns before the actor is gone: a call just after it may still be answered)
    set_deadline(str(tmp_path), 1020.0, "train.time_limit 70 s")
    assert deadline_board() is not board
    assert Deadline(deadline_board(), str(tmp_path), clock=clock).passed(margin_s=20.0)


def _until_dead(actor, timeout_s: float = 30.0) -> None:
    import time

    import ray

    give_up = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(actor.get.remote(""), timeout=10)
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < give_up, "the killed actor still answers"
        time.sleep(0.1)


@pytest.mark.usefixtures("ray_local")
def test_the_network_stops_after_the_epoch_in_which_its_share_ran_out(tmp_path):
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    from trainflow.trainer.loop import train_fn_per_worker

    cfg, prep, train, val = small_run(tmp_path)
    cfg = trial_config(cfg.to_dict(), {"model.params.mlp.epochs": 500, "train.early_stopping.patience": "off"})
    folder = tmp_path / "runs" / "net"
    set_deadline(str(folder), time.time() - 1, "train.time_limit 1 s")
    result = TorchTrainer(
        train_fn_per_worker,
        scaling_config=ScalingConfig(num_workers=0),
        train_loop_config={
            "config": cfg,
            "preprocessor": prep.to_dict(),
            "run_dir": str(folder),
            "deadline_board": fit_board(True),  # a fit in this process: the process's own deadlines
        },
        datasets={"train": train, "val": val},
    ).fit()
    assert [h["epoch"] for h in result.return_value] == [0]  # the first epoch always trains: a run ends with a model
    assert result.metrics[TIME_LIMITED] == 0  # the result says where the time ran out


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("family", ["xgboost", "catboost"])
def test_a_booster_stops_adding_rounds_when_its_share_is_spent_and_keeps_its_best_round(tmp_path, family):
    cfg, prep, train, val = small_run(tmp_path)
    cfg = trial_config(
        cfg.to_dict(),
        {
            "model.type": family,
            "model.params.num_boost_round": 1_000_000,
            "model.params.early_stopping_rounds": "off",
            "model.params.learning_rate": 0.001,
        },
    )
    set_deadline(run_dir(cfg, "cut"), time.time() + 4, "train.time_limit 4 s")
    started = time.monotonic()
    result = fit_here(cfg, prep, train, val, "cut")  # in the test's process, as a small table's fit runs
    assert time.monotonic() - started < 120  # a million rounds would take hours
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
    stopped = result.metrics[TIME_LIMITED]
    assert 0 < len(history) < 1_000_000 and stopped == history[-1]["epoch"]
    assert result.metrics["val_loss"] < history[0]["val_loss"]  # the best round so far, not the first


@pytest.mark.e2e
@pytest.mark.usefixtures("prefect_harness", "ray_local")
def test_a_run_under_a_tight_limit_keeps_its_first_family_and_leaves_out_one_cut_at_its_first_round(
    tmp_path, capsys, monkeypatch
):
    from trainflow.flows import retrain
    from trainflow.flows.cli import main as cli_main
    from trainflow.trainer import deadline

    # no minimum share: XGBoost starts after the limit is spent, trains one round and stops (deterministic), which
    # is no model worth its time; the share arithmetic that leaves a family out before it starts is tested above
    monkeypatch.setattr(deadline, "MIN_RUN_S", 0.0)
    monkeypatch.setattr(retrain, "MIN_RUN_S", 0.0)
    # and no margin (the shared run trains in this process, local mode): the network's last epoch ends past the limit.
    # With it, an epoch slowed by the machine's load has the network stop with that epoch's time left, which XGBoost's
    # millisecond rounds then use (seen once in a loaded suite: 71 rounds, kept in the ensemble)
    passed = deadline.Deadline.passed
    monkeypatch.setattr(deadline.Deadline, "passed", lambda self, margin_s=0.0: passed(self, 0.0))
    cfg = churn_config(
        tmp_path,
        rows=1500,
        model={"type": ["mlp", "xgboost"]},
        network={"epochs": 10_000},
        train={"time_limit": 4, "early_stopping": {"patience": "off"}},
        scaling={"num_workers": 1},
    )
    rc = cli_main(["retrain", "--config", str(cfg), "--run-name", "tb", "--summary-json", str(tmp_path / "s.json")])
    assert rc == 0
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["model_family"] == "mlp" and s["output_rows"] == 500 and s["test_metrics"]["test_loss"] > 0
    assert list(s["families_left_out"]) == ["xgboost"] and s["candidates"] is None
    # (one split of 1,500 rows, one worker each: both families in one Ray Train run, tb-families)
    mlp, xgb = "tb-families/tb-mlp", "tb-families/tb-xgboost"
    assert f"train.time_limit 4 s: its run {xgb} had time for its first round only" in s["families_left_out"]["xgboost"]
    budget = s["time_budget"]
    assert budget["time_limit"] == 4 and budget["cut_short"][mlp] < 10_000 and xgb not in budget["cut_short"]
    assert s["epochs_run"] == budget["cut_short"][mlp] + 1
    out = capsys.readouterr().out
    assert "xgboost    left out: train.time_limit 4 s" in out and f"stopped by it: {mlp} after step" in out
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {
        r.info.run_name: r.info.status
        for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
    }
    assert runs[xgb] == "KILLED"  # its MLflow run ends as it ended


def test_a_boosters_own_params_block_overrides_the_shared_keys_for_it_alone():
    from trainflow.trainer.families import REGISTRY
    from trainflow.trainer.families._trees import boost_budget

    prep = tiny_preprocessor()
    base = {
        "data": {"path": "x.parquet", "label": "y"},
        "task": "classification",
        "model": {"type": ["xgboost", "lightgbm", "catboost"]},
    }
    shared = config_from_dict(apply_overrides(base, {"model.params.learning_rate": 0.05}))
    own = config_from_dict(
        apply_overrides(
            base,
            {  # the dotted names a --set or a sweep writes
                "model.params.learning_rate": 0.05,
                "model.params.xgboost.learning_rate": 0.2,
                "model.params.xgboost.max_depth": 8,
                "model.params.lightgbm.num_leaves": 63,
                "model.params.catboost.num_boost_round": 3000,
            },
        )
    )
    assert {f: own.training_hash(f) == shared.training_hash(f) for f in ("xgboost", "lightgbm", "catboost", "mlp")} == {
        "xgboost": False,
        "lightgbm": False,
        "catboost": True,
        "mlp": True,
    }  # rounds only extend a run
    # each family's run reads its block over the shared keys: what its library gets and its budget
    xgb = REGISTRY["xgboost"].library_params(prep, own.for_family("xgboost"))
    lgb = REGISTRY["lightgbm"].library_params(prep, own.for_family("lightgbm"))
    assert (xgb["learning_rate"], xgb["max_depth"]) == (0.2, 8) and "num_leaves" not in xgb
    assert (lgb["learning_rate"], lgb["num_leaves"]) == (0.05, 63) and "max_depth" not in lgb
    assert boost_budget(own.for_family("catboost").model).limit == 3000
    assert boost_budget(own.for_family("xgboost").model).limit == 1000
    assert own.for_family("catboost").for_family("catboost") == own.for_family("catboost")  # resolved once
    import pickle

    assert pickle.loads(pickle.dumps(own)) == own  # the block classes are found by name, as a task's result needs
    # a key the family does not take, a block of a family the run does not train, a block's bad value: refused by name
    for model, message in [
        (
            {"type": "xgboost", "params": {"xgboost": {"num_leaves": 15}}},
            "model.params.xgboost: num_leaves: xgboost does not take it \\(it is lightgbm's\\)",
        ),
        (
            {"type": "xgboost", "params": {"lightgbm": {"num_leaves": 15}}},
            r"model.params.lightgbm: applies to lightgbm, which model.type \['xgboost'\] does not train",
        ),
        (
            {"type": "xgboost", "params": {"xgboost": {"max_dept": 3}}},
            "model.params.xgboost.max_dept: unknown key; did you mean model.params.xgboost.max_depth",
        ),
        ({"type": "lightgbm", "params": {"lightgbm": {"learning_rate": -1}}}, "model.params.lightgbm.learning_rate"),
        (
            {"type": "xgboost", "params": {"tree_method": "exact", "xgboost": {"external_memory": "always"}}},
            "model.params.xgboost: external_memory 'always' needs tree_method 'hist'",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            config_from_dict({**base, "model": model})
    # a sweep's trial of another family keeps the user's block (only its own family reads it)
    swept = config_from_dict({**base, "model": {"type": ["mlp", "xgboost"], "params": {"xgboost": {"max_depth": 4}}}})
    assert trial_config(swept.to_dict(), {"model.type": "mlp"}).model.families == ["mlp"]


def test_a_familys_training_hash_reads_only_its_own_keys_and_another_familys_keys_are_refused(tmp_path):
    base = {"data": {"path": "x.parquet", "label": "y"}, "task": "classification"}
    plain = config_from_dict(base)
    wider = config_from_dict(
        {**base, "model": {"params": {"mlp": {"hidden_sizes": [512, 256], "learning_rate": 0.01}}}}
    )
    deeper = config_from_dict({**base, "model": {"params": {"max_depth": 4, "num_leaves": 15}}})
    # the network's layers and optimiser never change a booster's hash (its resume and the skip of an unchanged run)
    assert all(wider.training_hash(f) == plain.training_hash(f) for f in ("xgboost", "lightgbm", "catboost"))
    assert wider.training_hash("mlp") != plain.training_hash("mlp")
    # nor a booster's keys the network's, or another booster's: num_leaves is LightGBM's alone
    assert deeper.training_hash("mlp") == plain.training_hash("mlp")
    assert deeper.training_hash("xgboost") != plain.training_hash("xgboost")
    only_depth = config_from_dict({**base, "model": {"params": {"max_depth": 4}}})
    assert deeper.training_hash("xgboost") == only_depth.training_hash("xgboost")
    assert deeper.training_hash("lightgbm") != only_depth.training_hash("lightgbm")
    # the preprocessing decides every family's inputs; the backtest's extra fit changes no model
    scaled = config_from_dict({**base, "preprocess": {"max_categories": 7}})
    assert all(scaled.training_hash(f) != plain.training_hash(f) for f in ("mlp", "xgboost"))
    no_fit = config_from_dict({**base, "split": {"backtest_fit": False}})
    assert all(no_fit.training_hash(f) == plain.training_hash(f) for f in ("mlp", "xgboost"))
    with pytest.raises(
        ConfigError, match=r"model.hidden_sizes: applies to mlp, which model.type \['xgboost'\] does not"
    ):
        config_from_dict({**base, "model": {"type": "xgboost", "hidden_sizes": [64]}})
    with pytest.raises(ConfigError, match="model.dropout: applies to mlp"):
        config_from_dict({**base, "model": {"type": ["lightgbm", "catboost"], "dropout": 0.1}})
    assert config_from_dict({**base, "model": {"type": "xgboost", "dropout": 0.3}})  # the default, written back
    # a sweep over the family keeps the network's layers for its mlp trials, and its booster trials accept them
    swept = config_from_dict(
        {
            **base,
            "model": {"type": "mlp", "hidden_sizes": [64]},
            "tune": {"search_space": {"model.type": {"choice": ["mlp", "lightgbm"]}}},
        }
    )
    assert trial_config(swept.to_dict(), {"model.type": "lightgbm"}).model.families == ["lightgbm"]


def test_auto_leaves_out_a_family_whose_first_fold_is_far_behind_and_says_why():
    import math

    from trainflow.flows.retrain import NOT_EARNING_MIN_ROWS, _not_earning, no_skill_loss
    from trainflow.preprocessors.tabular import TabularPreprocessor
    from trainflow.tasks.values import Prepared, TrainOutcome

    def fold0(family: str, losses: list[float]) -> TrainOutcome:
        return TrainOutcome(
            f"r-{family}-fold0", family, "/runs", [], [{"epoch": i, "val_loss": v} for i, v in enumerate(losses)]
        )

    def prepared(non_test_rows: int) -> Prepared:  # cross-fitted: the preprocessor is fitted on every non-test row
        prep = TabularPreprocessor.from_stats(
            "classification",
            "y",
            ["x1"],
            {"x1": (0.0, 1.0, -3.0, 3.0)},
            {},
            ["no", "yes"],
            None,
            non_test_rows,
            {"no": 50, "yes": 50},
        )
        return Prepared(prep, None, None, True, {}, fold_rows=[non_test_rows // 5] * 5)  # the plan's fold counts

    enough, few = prepared(5 * NOT_EARNING_MIN_ROWS), prepared(5 * NOT_EARNING_MIN_ROWS - 5)
    assert no_skill_loss(enough.preprocessor) == pytest.approx(math.log(2))  # even classes: log 2 = 0.693
    seen: dict[str, float] = {}
    assert _not_earning("catboost", fold0("catboost", [0.6, 0.45, 0.46]), seen, enough, 5) is None  # nothing to beat
    # LightGBM gains 0.16 over no skill, more than half CatBoost's 0.24: kept
    assert _not_earning("lightgbm", fold0("lightgbm", [0.6, 0.53]), seen, enough, 5) is None
    # a network that learnt next to nothing (0.68: a loss only 1.5x CatBoost's): left out, on a fold that can tell
    assert _not_earning("mlp", fold0("mlp", [0.69, 0.68]), dict(seen), few, 5) is None
    why = _not_earning("mlp", fold0("mlp", [0.69, 0.68]), seen, enough, 5)
    assert why == (
        "its first fold's validation loss 0.68 gains 0.0131 over a model with no skill (0.6931), under 0.5 "
        "of the best first fold's gain (catboost 0.45: 0.243); its folds of 5 not yet started were not trained"
    )
    assert seen == pytest.approx({"catboost": 0.45, "lightgbm": 0.53, "mlp": 0.68})
    assert _not_earning("xgboost", fold0("xgboost", []), seen, enough, 5) is None  # no validation loss reported: kept
