"""Real faults: a worker raises, hangs (and is killed by its watchdog); a checkpoint file is truncated."""

from pathlib import Path

import pytest
import torch

from tests.faults import EPOCHS, small_run, successive_faults
from trainflow.trainer.checkpoint import load_train_state, read_metrics, save_checkpoint
from trainflow.trainer.families.network import build_model
from trainflow.trainer.recovery import read_events, recoveries
from trainflow.trainer.runner import build_trainer, run_dir
from trainflow.config import config_from_dict


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_successive_worker_faults_each_resume_where_they_stopped(tmp_path):
    # one run survives a worker that raises (epoch 1) and one that hangs (epoch 2: the watchdog SIGKILLs it)
    cfg, prep, train, val = small_run(tmp_path, hang_timeout_s=10.0, max_failures=2)
    trainer = build_trainer(cfg, prep, train, val, "faults", train_fn=successive_faults(str(tmp_path)))
    result = trainer.fit()
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
        stopper = load_train_state(d)["early_stopping"]
    # every epoch ran exactly once
    assert [h["epoch"] for h in history] == list(range(EPOCHS))
    # the early-stopping state crossed the resumes: its best is the best of every attempt's epochs
    losses = [h["val_loss"] for h in history]
    assert stopper["best"] == pytest.approx(min(losses)) and stopper["best_epoch"] == losses.index(min(losses))
    events = read_events(run_dir(cfg, "faults"))
    assert [e["epoch"] for e in events if e["event"] == "resume"] == [1, 2], events
    raised, hung = recoveries(events)
    assert (raised["resumed_from_epoch"], hung["resumed_from_epoch"]) == (1, 2)
    assert "injected failure in epoch 1" in raised["error"]
    assert "no progress for" in hung["error"] and "hang_timeout_s=10" in hung["error"]


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
