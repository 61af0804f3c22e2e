"""Cross-fitting end to end: K fold models per family, trained one after another inside one Ray Train run; every
non-test row predicted
by the fold model that never trained on it; a bagged checkpoint that serves the fold models' average; a rerun that
trains no finished fold again."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import churn_config
from trainflow.flows.cli import main as cli_main
from trainflow.trainer.serving.predict import predict_table
from trainflow.trainer.serving.servable import BAG_FILE, fold_dir, load_servable

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]

FOLDS = 2


def _checkpoint_folders(run_path) -> dict[str, float]:
    return {p.name: p.stat().st_mtime for p in run_path.glob("checkpoint_*")}


def test_folds_train_predict_out_of_fold_serve_the_average_and_a_rerun_skips_finished_folds(tmp_path, capsys):
    cfg = churn_config(
        tmp_path,
        rows=600,
        network={"epochs": 2},
        train={"folds": FOLDS},
        checkpoint={"metric": "val_loss"},
        scaling={"num_workers": 2},
    )
    summary_path = tmp_path / "s.json"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "cf", "--summary-json", str(summary_path)]) == 0
    s = json.loads(summary_path.read_text())
    printed = capsys.readouterr().out
    assert "out-of-fold " in printed and f"of {FOLDS} fold models that never saw it" in printed

    # every row is a test row or predicted out of fold, once
    assert s["folds"] == FOLDS and s["oof_rows"] + s["test_rows"] == 600 and s["validation_rows"] == 0
    assert set(s["oof_metrics"]) >= {"oof_loss", "oof_accuracy", "oof_roc_auc"}
    assert s["oof_metrics"]["oof_loss"] == pytest.approx(s["best_checkpoint"]["metrics"]["val_loss"])
    assert (
        s["test_metrics"]["test_loss"] > 0
        and s["calibration_fit"]["fitted_on"] == f"out-of-fold rows ({s['oof_rows']})"
    )
    # train.refit auto: the network's fold models serve (only the boosters refit), and the summary says why
    assert s["refit"] == {
        "refitted": False,
        "why": "mlp has no member that refits (the boosters do: their size is a count of rounds)",
    }
    assignment = pads.dataset(s["split_path"], format="parquet").to_table().to_pandas()
    assert len(assignment) == 600
    test_rows = assignment["role"] == "test"
    assert assignment.loc[test_rows, "fold"].isna().all()
    folds = assignment.loc[~test_rows, "fold"].astype(int)
    assert sorted(folds.unique()) == list(range(FOLDS)) and folds.value_counts().min() > 600 * 0.8 / FOLDS * 0.6

    # every fold trained inside the family's one Ray Train run, each into its own folder of it; the worker group
    # started once (one worker: a small table)
    runs = tmp_path / "runs"
    fold_runs = [runs / "cf" / f"fold{k}" for k in range(FOLDS)]
    assert all(_checkpoint_folders(r) for r in fold_runs)
    outcomes = [json.loads((r / "trainflow_finished.json").read_text())["outcome"] for r in fold_runs]
    assert outcomes[0]["run_name"] == "cf-fold0"
    # each fold's steps counted over its own training rows (the non-test rows less its fold): the cosine schedule
    # ends at 0 with its last epoch, as one split's does
    assert all([h["epoch"] for h in o["history"]] == [0, 1] for o in outcomes)
    assert all(o["history"][-1]["learning_rate"] < 1e-12 for o in outcomes), [o["history"] for o in outcomes]
    starts = [json.loads(p.read_text()) for r in fold_runs for p in (r / "trainflow_events").glob("*.json")]
    started = [e["from_epoch"] for e in starts if e["event"] == "worker_start"]
    assert set(started) == {0} and len(started) >= FOLDS  # the first run's fold 0 started, then failed
    groups = [json.loads(p.read_text()) for p in (runs / "cf" / "trainflow_events").glob("*.json")]
    assert len([e for e in groups if e["event"] == "attempt"]) == 1, groups

    # the served model is the fold models' average (probabilities averaged; no calibration was needed here or it
    # applies after the average)
    bag = s["best_checkpoint"]["path"]
    assert json.loads(open(f"{bag}/{BAG_FILE}").read())["folds"] == FOLDS
    served = load_servable(bag, calibrated=False)
    table = pq.read_table(tmp_path / "data" / "train.parquet").slice(0, 50)
    x = served.preprocessor.transform_features(table, strict=False)
    members = [load_servable(fold_dir(bag, k), calibrated=False).predict(x) for k in range(FOLDS)]
    averaged = np.mean([torch.softmax(torch.from_numpy(m), 1).numpy() for m in members], axis=0)
    got = torch.softmax(torch.from_numpy(served.predict(x)), 1).numpy()
    assert np.allclose(got, averaged, atol=1e-5)
    assert predict_table(load_servable(bag), table).num_rows == 50
    assert s["output_rows"] == s["input_rows"] == 500

    # a rerun of the same run name trains no finished fold again: the same bag, no new checkpoint
    before = [_checkpoint_folders(r) for r in fold_runs]
    again = tmp_path / "again.json"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "cf", "--force", "--summary-json", str(again)]) == 0
    second = json.loads(again.read_text())
    assert [_checkpoint_folders(r) for r in fold_runs] == before
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    # one MLflow run for the family holds each fold's metrics, epoch by epoch
    named = [
        r for r in client.search_runs([e.experiment_id for e in client.search_experiments()]) if r.info.run_name == "cf"
    ]
    (family_run,) = [
        r for r in named if "fold0/val_loss" in r.data.metrics
    ]  # the first retrain's; the rerun trained none
    for k in range(FOLDS):
        assert len(client.get_metric_history(family_run.info.run_id, f"fold{k}/val_loss")) == 2  # its epochs
    every = {
        r.info.run_name: r.info.status
        for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
    }
    assert "RUNNING" not in every.values(), every  # the bag's run (registered) ended with the retrain too
    # the same fold models predict the same out-of-fold rows (float32 sums in other batch shapes: equal to 1e-6)
    assert second["best_checkpoint"]["uri"] == s["best_checkpoint"]["uri"]
    assert second["oof_metrics"] == pytest.approx(s["oof_metrics"], rel=1e-6)


def test_a_small_tables_families_share_one_ray_train_run_and_one_whose_code_raises_is_left_out(tmp_path, capsys):
    # XGBoost refuses max_depth -1 when it trains (LightGBM reads it as no limit): XGBoost fails inside the shared
    # run, LightGBM, trained before it, is kept
    cfg = churn_config(
        tmp_path,
        rows=300,
        model={"type": ["lightgbm", "xgboost"], "params": {"max_depth": -1, "num_boost_round": 30}},
        train={"folds": FOLDS},
    )
    summary_path = tmp_path / "s.json"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "sh", "--summary-json", str(summary_path)]) == 0
    s = json.loads(summary_path.read_text())
    shared = tmp_path / "runs" / "sh-families"
    # one Ray Train run for both families: one worker group started once
    attempts = [json.loads(p.read_text()) for p in (shared / "trainflow_events").glob("*.json")]
    assert len([e for e in attempts if e["event"] == "attempt"]) == 1, attempts
    # each family in its own folder of the run, each fold in its own folder of that
    lgb = [shared / "sh-lightgbm" / f"fold{k}" for k in range(FOLDS)]
    assert all(_checkpoint_folders(f) for f in lgb)
    assert json.loads((lgb[1] / "trainflow_finished.json").read_text())["outcome"]["run_name"] == (
        "sh-families/sh-lightgbm-fold1"
    )
    assert s["model_family"] == "lightgbm" and s["best_checkpoint"]["path"].startswith(str(shared / "sh-lightgbm"))
    assert "max_depth" in s["families_failed"]["xgboost"]
    assert "max_depth" in json.loads((shared / "sh-xgboost" / "trainflow_failed.json").read_text())["error"]
    assert s["output_rows"] == s["input_rows"] == 500
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
    for k in range(FOLDS):  # the family's one MLflow run holds each fold's metrics
        assert client.get_metric_history(runs["sh-families/sh-lightgbm"].info.run_id, f"fold{k}/val_loss")
    assert runs["sh-families/sh-xgboost"].info.status == "FAILED"
    assert "RUNNING" not in {r.info.status for r in runs.values()}
    _the_chosen_booster_was_refitted(s, capsys.readouterr().out, shared, client, runs)

    # a rerun of the run name with XGBoost mended in its own block: LightGBM's finished folds are reused (its config
    # is the same), XGBoost trains from nothing (never from LightGBM's latest checkpoint, which Ray Train restores)
    before = [_checkpoint_folders(f) for f in lgb]
    again = tmp_path / "again.json"
    mend = ["--set", "model.params.xgboost.max_depth=6"]
    assert (
        cli_main(["retrain", "--config", str(cfg), "--run-name", "sh", "--force", "--summary-json", str(again), *mend])
        == 0
    )
    assert [_checkpoint_folders(f) for f in lgb] == before
    second = json.loads(again.read_text())
    assert not second.get("families_failed"), second.get("families_failed")
    xgb = [shared / "sh-xgboost" / f"fold{k}" for k in range(FOLDS)]
    starts = [json.loads(p.read_text()) for f in xgb for p in (f / "trainflow_events").glob("*.json")]
    for f in xgb:  # both folds trained, each into its own folder
        assert _checkpoint_folders(f)
    started = [e["from_epoch"] for e in starts if e["event"] == "worker_start"]
    assert set(started) == {0} and len(started) >= FOLDS  # the first run's fold 0 started, then failed
    assert not [e for e in starts if e["event"] == "resume"]
    # both families now: the leaderboard's test figures are the models chosen among, the served refit's beside them
    refit = second["refit"]
    [row] = [r for r in second["candidates"] if r["family"] == second["model_family"]]
    assert refit["refitted"] and row["test_loss"] == refit["test_metrics"]["chosen"]["test_loss"]
    assert second["test_metrics"] == refit["test_metrics"]["refitted"]


def _the_chosen_booster_was_refitted(s: dict, printed: str, shared, client, runs: dict) -> None:
    """train.refit auto: the chosen LightGBM trained again on every non-test row (twice each fold model's rows, with 2
    folds) for its fold models' mean best rounds times that ratio, without early stopping; that model is scored on
    the test rows, calibrated on the out-of-fold rows, registered and served; the summary gives both test figures."""
    import lightgbm as lgb

    refit = s["refit"]
    assert refit["refitted"] and refit["rows"] == s["oof_rows"]
    [line] = refit["members"]
    assert line["family"] == "lightgbm" and line["run"] == "sh-families/sh-lightgbm/refit"
    assert line["chosen_rounds"] == [e + 1 for e in s["training_budget"]["fold_epochs"]]
    assert line["rounds"] == max(1, round(np.mean(line["chosen_rounds"]) * 2))
    served = s["best_checkpoint"]["uri"]
    assert served.startswith(str(shared / "sh-lightgbm" / "refit" / "checkpoint_"))  # its run inside the family's
    assert lgb.Booster(model_file=f"{served}/model.txt").num_trees() == line["rounds"]  # binary: a tree a round
    # its figures before the test rows are the chosen fold models' (a refit has no rows of its own to be judged on)
    assert s["oof_metrics"]["oof_loss"] == pytest.approx(s["best_checkpoint"]["metrics"]["val_loss"])
    assert s["calibration_fit"]["fitted_on"] == f"out-of-fold rows ({s['oof_rows']})"
    figures = refit["test_metrics"]
    assert s["test_metrics"] == figures["refitted"] and figures["chosen"]["test_loss"] > 0
    assert f"refit             lightgbm {line['rounds']} rounds on all {s['oof_rows']} rows" in printed
    assert f"best checkpoint   round {s['best_checkpoint']['epoch']} of its refit: " in printed
    version = client.get_model_version(s["registered_model"], s["model_version"])  # the family's run, as unrefitted
    assert client.get_run(version.run_id).info.run_name == s["run_name"] == "sh-families/sh-lightgbm"
    assert runs["sh-families/sh-lightgbm/refit"].info.status == "FINISHED"  # the refit's own, nested too


def test_an_ensembles_boosters_refit_in_one_run_and_a_rerun_trains_neither_again(tmp_path, monkeypatch):
    """train.refit auto with an ensemble of two boosters that trained in one shared run: both refit one after
    another in one run of their own, <name>-families/refit (Ray Train's start paid once, as for their folds), each in
    its folder with its own MLflow run; a rerun of the run name (--force) reuses both finished refits."""
    from tests.conftest import make_regression_table, write_config, write_parquet

    table = make_regression_table(800, seed=3)
    noisy = table["target y"].to_numpy() + np.random.default_rng(5).normal(0, 1.0, table.num_rows)
    write_parquet(table.set_column(table.num_columns - 1, "target y", pa.array(noisy)), tmp_path / "data" / "t.parquet")
    cfg = write_config(
        tmp_path,
        {
            "data": {"path": "data/t.parquet", "label": "target y", "id_column": "row id"},
            "task": "regression",
            # two boosters fitting noise fast, each its own way: their weighted mean is the better model on the
            # out-of-fold rows (measured: oof_loss 0.163 against XGBoost's 0.174 and LightGBM's 0.204)
            "model": {
                "type": ["xgboost", "lightgbm"],
                "params": {"learning_rate": 0.5, "num_boost_round": 40, "xgboost": {"max_depth": 6}},
            },
            "train": {"folds": FOLDS},
            "storage_path": "runs",
            "mlflow": {"experiment": "test"},
        },
    )
    first, again = tmp_path / "s.json", tmp_path / "again.json"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "rf", "--summary-json", str(first)]) == 0
    s = json.loads(first.read_text())
    assert s["model_family"] == "ensemble", s["candidates"]
    assert sorted(m["family"] for m in s["ensemble"]["members"] if m["weight"] > 0) == ["lightgbm", "xgboost"]
    refit = s["refit"]
    assert refit["refitted"] and refit["rows"] == s["oof_rows"]
    home = tmp_path / "runs" / "rf-families" / "refit"
    assert {m["family"]: m["run"] for m in refit["members"]} == {
        f: f"rf-families/refit/rf-{f}" for f in ("xgboost", "lightgbm")
    }
    events = [json.loads(p.read_text()) for p in (home / "trainflow_events").glob("*.json")]
    assert len([e for e in events if e["event"] == "attempt"]) == 1, events  # one run for both
    folders = {f: _checkpoint_folders(home / f"rf-{f}" / "fold0") for f in ("xgboost", "lightgbm")}
    assert all(folders.values()), folders
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
    for f in ("xgboost", "lightgbm"):
        assert runs[f"rf-families/refit/rf-{f}"].info.status == "FINISHED"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "rf", "--force", "--summary-json", str(again)]) == 0
    second = json.loads(again.read_text())
    assert {f: _checkpoint_folders(home / f"rf-{f}" / "fold0") for f in folders} == folders
    assert second["refit"]["members"] == refit["members"] and second["test_metrics"] == s["test_metrics"]
    # a refit folder whose checkpoints say another training config (planted): never resumed onto, never deleted; the
    # chosen ensemble serves and the summary says why
    planted = sorted((home / "rf-xgboost" / "fold0").glob("checkpoint_*"))
    for checkpoint in planted:
        lineage = json.loads((checkpoint / "lineage.json").read_text())
        (checkpoint / "lineage.json").write_text(json.dumps({**lineage, "config_hash": "config:someone-else"}))
    third = tmp_path / "third.json"
    assert cli_main(["retrain", "--config", str(cfg), "--run-name", "rf", "--force", "--summary-json", str(third)]) == 0
    held = json.loads(third.read_text())["refit"]
    assert not held["refitted"] and "holds a run of other data or another training config" in held["why"], held
    assert sorted((home / "rf-xgboost" / "fold0").glob("checkpoint_*")) == planted
    assert _checkpoint_folders(home / "rf-lightgbm" / "fold0") == folders["lightgbm"]

    # a member whose code raises inside the shared refit (its folds trained): the other member still refits, the
    # chosen ensemble serves with the reason, and each member's MLflow run ends as its own refit did
    from trainflow.catalogue import families

    real = families()["lightgbm"].train_fn

    def raises_in_the_refit(loop_config):
        if "/refit/" in str(loop_config["run_dir"]):
            raise RuntimeError("injected: LightGBM's refit raises")
        return real(loop_config)

    monkeypatch.setitem(
        families(), "lightgbm", dataclasses.replace(families()["lightgbm"], train_fn=raises_in_the_refit)
    )
    fourth = tmp_path / "fourth.json"
    assert (
        cli_main(["retrain", "--config", str(cfg), "--run-name", "rf2", "--force", "--summary-json", str(fourth)]) == 0
    )
    failed = json.loads(fourth.read_text())
    assert failed["model_family"] == "ensemble" and not failed["refit"]["refitted"], failed["refit"]
    assert "lightgbm" in failed["refit"]["why"] and "injected: LightGBM's refit raises" in failed["refit"]["why"]
    runs = {r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
    assert runs["rf2-families/refit/rf2-xgboost"].info.status == "FINISHED"
    assert runs["rf2-families/refit/rf2-lightgbm"].info.status == "FAILED"
    assert _checkpoint_folders(tmp_path / "runs" / "rf2-families" / "refit" / "rf2-xgboost" / "fold0")
