"""Real faults: a worker raises, hangs (and is killed by its watchdog); a checkpoint file is truncated."""

import json
from pathlib import Path

import pytest
import torch

from tests.faults import EPOCHS, small_run, successive_faults, wait_fold_registered
from trainflow.trainer.serving.checkpoint import load_train_state, read_metrics, save_checkpoint
from trainflow.trainer.families.network import build_model
from trainflow.trainer.recovery import read_events, recoveries
from trainflow.trainer.runner import build_trainer, run_dir
from trainflow.config import config_from_dict


def test_a_fixed_hang_timeout_applies_from_the_first_progress_mark_and_start_up_gets_the_allowance():
    # a worker group's set-up on a loaded machine outlasted 10 s: killed there, the attempt restarted from nothing
    from trainflow.limits import HANG_FIRST_S
    from trainflow.trainer.watchdog import Watchdog

    fixed, auto = Watchdog(10.0, None, 0), Watchdog("auto", None, 0)
    assert fixed.timeout_s == auto.timeout_s == HANG_FIRST_S
    # an attempt's first epoch starting is still start-up: its shard's first block may take long to arrive (on a
    # loaded machine both workers were killed 12 s after "the start of epoch 0", before any step)
    fixed.beat("the start of epoch 2", startup=True)
    assert fixed.timeout_s == HANG_FIRST_S and fixed.where == "the start of epoch 2" and not fixed.started
    fixed.beat()  # its first mini-batch
    assert fixed.timeout_s == 10.0
    assert Watchdog(600.0, None, 0).timeout_s == 600.0  # a longer value than the allowance is kept


@pytest.mark.usefixtures("prefect_harness")
def test_select_skips_a_truncated_checkpoint(tmp_path):
    from trainflow.tasks.select import select
    from trainflow.tasks.values import TrainOutcome

    cfg = config_from_dict(
        {
            "data": {"path": "x", "label": "y"},
            "task": "regression",
            "model": {"type": "mlp", "numeric_embedding": "none"},
        },
        base_dir=tmp_path,
    )
    from trainflow.preprocessors.tabular import TabularPreprocessor

    prep = TabularPreprocessor(
        task="regression", label="y", numeric={"a": {"mean": 0.0, "std": 1.0}}, feature_order=["a"]
    )
    model = build_model(1, 1, cfg.model.model_dump())
    opt = torch.optim.Adam(model.parameters())
    ckpts = []
    for epoch, loss in enumerate([0.9, 0.5, 0.7]):
        d = tmp_path / f"checkpoint_{epoch}"
        d.mkdir()
        m = {"epoch": epoch, "val_loss": loss}
        save_checkpoint(
            d,
            model.state_dict(),
            {"optimizer": opt.state_dict(), "epoch": epoch},
            m,
            [m],
            prep.to_dict(),
            cfg.to_dict(),
        )
        ckpts.append({"path": str(d), "epoch": epoch, "metrics": m})
    ckpts.append({"path": str(tmp_path / "nan"), "epoch": 3, "metrics": {"epoch": 3, "val_loss": float("nan")}})
    best = tmp_path / "checkpoint_1" / "model.pt"
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    outcome = TrainOutcome(run_name="r", family="mlp", run_path=str(tmp_path), checkpoints=ckpts, history=[])
    chosen = select(outcome, cfg)
    assert chosen.epoch == 2  # epoch 1 was best but is truncated; epoch 2 is the next best
    reasons = {Path(s["path"]).name: s["reason"] for s in chosen.skipped}
    assert "cannot be loaded" in reasons["checkpoint_1"] and "not finite" in reasons["nan"]

    for c in ckpts[:3]:
        (Path(c["path"]) / "model.pt").write_bytes(b"")
    from trainflow.errors import CheckpointError

    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        select(outcome, cfg)


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_successive_worker_faults_in_a_fold_each_resume_where_they_stopped_and_the_finished_fold_is_not_trained_again(
    tmp_path,
):
    # one run of two folds; in fold 1 a worker raises (epoch 1), then one hangs (epoch 2: the watchdog SIGKILLs it)
    # (one fit for what were two tests, successive faults and a fault in a fold: 109 s of the suite)
    from trainflow.trainer.recovery import fold_events

    # hang_timeout_s 20: at 10 a loaded suite once saw fold 0's healthy worker killed too (restarted from epoch 4)
    cfg, prep, train, val = small_run(tmp_path, hang_timeout_s=20.0, max_failures=2)
    folds = {0: (train, val), 1: (train, val)}
    result = build_trainer(cfg, prep, None, None, "cf", train_fn=successive_faults(str(tmp_path)), folds=folds).fit()
    run = run_dir(cfg, "cf")
    by_fold = {k: [m for _, m in result.best_checkpoints if m.get("fold") == k] for k in folds}
    # each fold kept its own checkpoints, in its own folder of the one run
    assert {m["epoch"] for m in by_fold[0]} >= {EPOCHS - 1} and {m["epoch"] for m in by_fold[1]} >= {EPOCHS - 1}
    assert all(f"/fold{k}/checkpoint_" in c.path for c, m in result.best_checkpoints for k in [m["fold"]])
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]  # fold 1's, across the restarts
        stopper = load_train_state(d)["early_stopping"]
    # every epoch of fold 1 ran exactly once
    assert [h["epoch"] for h in history] == list(range(EPOCHS))
    # the early-stopping state crossed the resumes: its best is the best of every attempt's epochs
    losses = [h["val_loss"] for h in history]
    assert stopper["best"] == pytest.approx(min(losses)) and stopper["best_epoch"] == losses.index(min(losses))
    events = fold_events(run, {k: f"{run}/fold{k}" for k in folds})
    starts = [(e["fold"], e["from_epoch"]) for e in events if e["event"] == "worker_start"]
    assert [s for s in starts if s[0] == 0] == [(0, 0)] * 2, starts  # fold 0 trained once, by both ranks
    assert [s for s in starts if s[0] == 1] == [(1, 0)] * 2 + [(1, 1)] * 2 + [(1, 2)] * 2, starts
    raised, hung = recoveries(events)
    assert (raised["fold"], raised["resumed_from_epoch"]) == (1, 1), raised
    assert (hung["fold"], hung["resumed_from_epoch"]) == (1, 2), hung
    assert "injected failure in fold 1, epoch 1" in raised["error"]
    assert "no progress for" in hung["error"] and "hang_timeout_s=20" in hung["error"]


def _killed_after_fold(marker_dir: str, family_train_fn):
    """A family's loop per fold whose first attempt at fold 1 trains it, waits until Ray Train's controller has
    registered a checkpoint of it, then kills its own worker process (a dead worker, no error raised)."""

    def train_fn(loop_config):
        import os
        from pathlib import Path

        family_train_fn(loop_config)
        marker = Path(marker_dir) / "killed"
        if loop_config["fold"] != 1 or marker.exists():
            return
        marker.touch()
        wait_fold_registered(loop_config["deadline_dir"], 1, "lightgbm")
        os._exit(1)

    return train_fn


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_a_worker_killed_in_a_shared_run_resumes_the_family_and_fold_it_was_in_and_the_rule_leaves_out_one(tmp_path):
    """One shared run under auto's not-earning rule: XGBoost's folds, then LightGBM's and CatBoost's first folds, then
    the other folds of those the rule keeps (CatBoost at a learning rate that learns nothing is left out after its
    first fold, in the worker: no second Ray Train start); the worker dies in LightGBM's second fold and the restart
    resumes that fold, deciding the same from the first folds in storage."""
    from trainflow.config import trial_config
    from trainflow.flows.retrain import no_skill_loss
    from trainflow.trainer.families.lightgbm_family import train_fn as lightgbm_loop
    from trainflow.trainer.recovery import fold_events
    from trainflow.trainer.runner import build_shared_trainer
    from trainflow.trainer.session import LEFT_OUT_FILE

    cfg, prep, train, val = small_run(tmp_path, max_failures=1)
    cfg = trial_config(
        cfg.to_dict(),
        {
            "scaling.num_workers": 1,
            "model.type": ["xgboost", "lightgbm", "catboost"],
            "model.params.num_boost_round": 20,
            "model.params.catboost.learning_rate": 1e-6,
        },
    )
    families, folds = ["xgboost", "lightgbm", "catboost"], {0: (train, val), 1: (train, val)}
    rule = {
        "first": "xgboost",
        "first_fold": 0,
        "order": [(f, f"sh-{f}") for f in families],
        "base": no_skill_loss(prep),
        "fold_rows": 1000,  # the plan's count decides whether a fold can tell; this test's folds are its own
        "k": 2,
    }
    result = build_shared_trainer(
        {f: cfg.for_family(f) for f in families},
        prep,
        "sh",
        [(f, f"sh-{f}", [0, 1], 0) for f in families],
        folds,
        {f: None for f in families},
        train_fns={"lightgbm": _killed_after_fold(str(tmp_path), lightgbm_loop)},
        not_earning=rule,
    ).fit()
    run = run_dir(cfg, "sh")
    kept = {(m["family"], m["fold"]) for _, m in result.best_checkpoints}
    # every kept family's every fold, in its own folder; CatBoost its first fold only
    assert kept == {(f, k) for f in ("xgboost", "lightgbm") for k in folds} | {("catboost", 0)}
    assert all(f"/sh-{m['family']}/fold{m['fold']}/checkpoint_" in c.path for c, m in result.best_checkpoints)
    why = json.loads((Path(run) / "sh-catboost" / LEFT_OUT_FILE).read_text())["why"]
    assert why.startswith("its first fold's validation loss") and "not yet started were not trained" in why
    assert not (Path(run) / "sh-lightgbm" / LEFT_OUT_FILE).exists()
    events = fold_events(run, {(f, k): f"{run}/sh-{f}/fold{k}" for f in families for k in folds})
    starts = [(e["family"], e["fold"]) for e in events if e["event"] == "worker_start"]
    # the first family's folds, the others' first folds, then the kept one's second fold; the fold the worker died in
    # started again, and nothing before it trained twice
    assert starts == [
        ("xgboost", 0),
        ("xgboost", 1),
        ("lightgbm", 0),
        ("catboost", 0),
        ("lightgbm", 1),
        ("lightgbm", 1),
    ]
    (recovered,) = recoveries(events)
    assert (recovered["family"], recovered["fold"]) == ("lightgbm", 1)
    assert len([e for e in read_events(run) if e["event"] == "attempt"]) == 2


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("storage", ["disk", "s3"])
def test_a_local_mode_fit_writes_whole_checkpoints_and_a_retry_resumes_from_the_newest_on_disk(
    tmp_path, storage, request
):
    # scaling.local_mode: the fit runs in this process (Ray Train's local mode persists nothing itself); it raises
    # after two epochs, and a second fit of the run (the train task's Prefect retry) resumes from what is in storage
    # (a folder, or moto's S3)
    from tests.conftest import BUCKET
    from tests.faults import train_fn_per_worker
    from trainflow.config import trial_config
    from trainflow.run.storage import filesystem_for, join, write_bytes
    from trainflow.trainer.serving.checkpoint import METRICS_FILE, checkpoints_on_disk, latest_in_run
    from trainflow.trainer.runner import fit_reports, local_checkpoints

    cfg, prep, train, val = small_run(tmp_path)
    where = str(tmp_path / "runs")
    if storage == "s3":
        request.getfixturevalue("s3_endpoint")
        where = f"s3://{BUCKET}/{tmp_path.name}/runs"
    cfg = trial_config(
        cfg.to_dict(),
        {
            "scaling.num_workers": 1,
            "scaling.local_mode": True,
            "checkpoint.min_interval_s": 0,
            "storage_path": where,
        },
    )
    path, marker = run_dir(cfg, "local"), tmp_path / "raised"

    def raises_once(loop_config):
        if marker.exists():
            return train_fn_per_worker(loop_config)
        train_fn_per_worker(
            {**loop_config, "config": trial_config(loop_config["config"].to_dict(), {"model.params.mlp.epochs": 2})}
        )
        marker.touch()
        raise RuntimeError("injected failure after epoch 1")

    def latest_epoch() -> int:
        with latest_in_run(path).as_directory() as d:
            return read_metrics(d)["epoch"]

    seen: list[dict] = []
    with fit_reports(path, seen.append, True) as callbacks:
        trainer = build_trainer(cfg, prep, train, val, "local", train_fn=raises_once, callbacks=callbacks, local=True)
        with pytest.raises(RuntimeError, match="injected failure"):
            trainer.fit()
    assert [c["epoch"] for c in checkpoints_on_disk(path)] == [0, 1]  # each report's checkpoint, in the run's folder
    assert [m["epoch"] for m in seen] == [0, 1]  # handed to the caller as they came
    # a copy cut short (no metrics.json yet), named newer than every whole one: never a checkpoint to resume from
    cut = join(path, "checkpoint_2999-01-01_00-00-00.000000")
    write_bytes(join(cut, "model.pt"), b"cut short")
    assert latest_in_run(path).path.rsplit("/", 1)[-1] != cut.rsplit("/", 1)[-1] and latest_epoch() == 1

    with fit_reports(path, seen.append, True) as callbacks:
        trainer = build_trainer(cfg, prep, train, val, "local", train_fn=raises_once, callbacks=callbacks, local=True)
        result = trainer.fit()
    assert result.path is None  # no Ray Train run: the loop ran in this process
    kept = local_checkpoints([path], cfg.checkpoint.num_to_keep, "val_loss", "min")
    with kept[-1][0].as_directory() as d:
        history = read_metrics(d)["history"]
    assert [h["epoch"] for h in history] == list(range(EPOCHS))  # every epoch once, across the two fits
    assert [m["epoch"] for m in seen] == list(range(EPOCHS))
    # checkpoint.num_to_keep (2) best by val_loss, and the latest; the others removed as Ray's manager removes them
    best = sorted(h["val_loss"] for h in history)[:2]
    assert len(kept) <= 3 and kept[-1][1]["epoch"] == EPOCHS - 1
    assert {round(m["val_loss"], 9) for _, m in kept} >= {round(v, 9) for v in best}
    assert len(checkpoints_on_disk(path)) == len(kept)
    fs, _ = filesystem_for(path)
    assert all(fs.get_file_info(f"{c.path}/{METRICS_FILE}").size for c, _ in kept)
    events = read_events(path)
    assert [e["local"] for e in events if e["event"] == "attempt"] == [True, True]
    assert [e["epoch"] for e in events if e["event"] == "resume"] == [2]


@pytest.mark.usefixtures("ray_local")
def test_a_local_mode_fit_ends_at_its_next_step_once_the_process_is_asked_to_stop(tmp_path):
    # SIGTERM (a cancelled flow run) shuts Ray down, which ends a worker group; a loop in the flow's own process
    # ends at its next step instead of training on, its checkpoints so far in storage for a rerun
    from trainflow.run import runtime
    from trainflow.config import trial_config
    from trainflow.trainer.serving.checkpoint import checkpoints_on_disk
    from trainflow.trainer.runner import fit_reports

    cfg, prep, train, val = small_run(tmp_path)
    cfg = trial_config(
        cfg.to_dict(), {"scaling.num_workers": 1, "scaling.local_mode": True, "checkpoint.min_interval_s": 0}
    )
    path = run_dir(cfg, "stopped")

    def on_report(metrics: dict) -> None:
        runtime._stop_requested.set()  # what the SIGTERM handler sets, as the first epoch is reported

    try:
        with fit_reports(path, on_report, True) as callbacks:
            trainer = build_trainer(cfg, prep, train, val, "stopped", callbacks=callbacks, local=True)
            with pytest.raises(RuntimeError, match="asked to stop"):
                trainer.fit()
    finally:
        runtime._stop_requested.clear()
    assert [c["epoch"] for c in checkpoints_on_disk(path)] == [0]


@pytest.mark.usefixtures("ray_local")
def test_a_local_mode_resume_loads_a_planted_checkpoints_weights_as_data_only(tmp_path):
    # local mode resumes from the newest complete folder in the run's storage (trainer/serving/checkpoint.py latest_in_run),
    # as Ray Train from the latest it registered: a folder someone else wrote there, newer by its name, is read with
    # the same loaders, so a pickle where the weights go is refused (torch.load weights_only) and never runs
    import pickle
    import shutil

    from tests.faults import fit_here
    from trainflow.config import trial_config
    from trainflow.trainer.serving.checkpoint import MODEL_FILE

    cfg, prep, train, val = small_run(tmp_path)
    cfg = trial_config(
        cfg.to_dict(), {"scaling.num_workers": 1, "model.params.mlp.epochs": 2, "checkpoint.min_interval_s": 0}
    )
    first = fit_here(cfg, prep, train, val, "planted")
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    newest = Path(first.checkpoint.path)
    planted = newest.parent / "checkpoint_2999-01-01_00-00-00.000000"
    shutil.copytree(newest, planted)
    (planted / MODEL_FILE).write_bytes(pickle.dumps(Payload()))
    with pytest.raises(Exception, match="(?i)weights.only"):
        fit_here(cfg, prep, train, val, "planted")
    assert not marker.exists()
