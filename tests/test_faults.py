"""Real faults: a worker raises, a worker is SIGKILLed, a checkpoint file is truncated."""

import os
import signal
import time
from pathlib import Path

import pytest
import ray.data
import torch

from tests.conftest import make_regression_table
from trainer.checkpoint import read_metrics, save_checkpoint
from trainer.loop import train_fn_per_worker
from trainer.model import build_model
from trainer.recovery import read_events, recoveries
from trainer.runner import build_trainer, run_dir
from trainflow.config import config_from_dict
from trainflow.data import TableSpec, apply_preprocessor, check_columns, fit_preprocessor

EPOCHS, FAIL_AT = 4, 2


def _setup(tmp_path):
    table = make_regression_table(1200)
    cfg = config_from_dict({
        "data": {"path": "mem", "label": "target y", "id_column": "row id"}, "task": "regression",
        "train": {"epochs": EPOCHS, "batch_size": 64, "learning_rate": 0.01},
        "scaling": {"num_workers": 2}, "checkpoint": {"num_to_keep": 2}, "failure": {"max_failures": 2},
        "storage_path": str(tmp_path / "runs"),
    }, base_dir=tmp_path)
    features, numeric, cat = check_columns(table.schema, cfg.data, "regression", "mem")
    spec = TableSpec("mem", [], "target y", "row id", numeric, cat, table.num_rows, "", features)
    train, val = ray.data.from_arrow(table.slice(0, 1000)), ray.data.from_arrow(table.slice(1000))
    prep = fit_preprocessor(train, spec, "regression")
    return cfg.to_dict(), prep, apply_preprocessor(train, prep).materialize(), apply_preprocessor(val, prep).materialize()


def _faulty(marker_dir: str, fault: str):
    def train_fn(loop_config):
        rank = ray.train.get_context().get_world_rank()
        marker = Path(marker_dir) / f"faulted-{rank}"
        if not marker.exists():
            marker.touch()
            # train the first FAIL_AT epochs for real (checkpoints reported), then fail inside epoch FAIL_AT
            first = {**loop_config, "config": {**loop_config["config"], "train": {**loop_config["config"]["train"], "epochs": FAIL_AT}}}
            train_fn_per_worker(first)
            if rank == 1:
                time.sleep(3)  # some way into epoch FAIL_AT: the controller has registered epoch 1's checkpoint
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("injected failure in epoch 2")
            ray.train.report({"epoch": FAIL_AT, "waiting": 1.0})  # blocks until the group is torn down
        return train_fn_per_worker(loop_config)

    return train_fn


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_worker_failure_resumes_at_the_failed_epoch(tmp_path, fault):
    cfg, prep, train, val = _setup(tmp_path)
    name = f"fault-{fault}"
    trainer = build_trainer(cfg, prep, train, val, name, train_fn=_faulty(str(tmp_path), fault))
    result = trainer.fit()
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
    # every epoch ran exactly once: epochs 0-1 before the fault, 2-3 after the resume
    assert [h["epoch"] for h in history] == list(range(EPOCHS))
    events = read_events(run_dir(cfg, name))
    assert [e["epoch"] for e in events if e["event"] == "resume"] == [FAIL_AT]
    rec = recoveries(events)
    assert len(rec) == 1 and rec[0]["resumed_from_epoch"] == FAIL_AT
    if fault == "raise":
        assert "injected failure" in rec[0]["error"]


@pytest.mark.usefixtures("prefect_harness")
def test_select_skips_a_truncated_checkpoint(tmp_path):
    from tasks.select import select
    from tasks.train import TrainOutcome

    cfg = config_from_dict({"data": {"path": "x", "label": "y"}, "task": "regression"}, base_dir=tmp_path)
    from preprocessors.tabular import TabularPreprocessor

    prep = TabularPreprocessor(task="regression", label="y", numeric={"a": {"mean": 0.0, "std": 1.0}}, feature_order=["a"])
    model = build_model(1, 1, cfg.model.hidden_sizes, cfg.model.dropout)
    opt = torch.optim.Adam(model.parameters())
    ckpts = []
    for epoch, loss in enumerate([0.9, 0.5, 0.7]):
        d = tmp_path / f"checkpoint_{epoch}"
        d.mkdir()
        m = {"epoch": epoch, "val_loss": loss}
        save_checkpoint(d, model, opt, epoch, 0, m, [m], prep.to_dict(), cfg.to_dict())
        ckpts.append({"path": str(d), "epoch": epoch, "metrics": m})
    ckpts.append({"path": str(tmp_path / "nan"), "epoch": 3, "metrics": {"epoch": 3, "val_loss": float("nan")}})
    best = tmp_path / "checkpoint_1" / "model.pt"
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    outcome = TrainOutcome(run_name="r", run_path=str(tmp_path), checkpoints=ckpts, history=[])
    chosen = select(outcome, cfg)
    assert chosen.epoch == 2  # epoch 1 was best but is truncated; epoch 2 is the next best
    reasons = {Path(s["path"]).name: s["reason"] for s in chosen.skipped}
    assert "cannot be loaded" in reasons["checkpoint_1"] and "not finite" in reasons["nan"]

    for c in ckpts[:3]:
        (Path(c["path"]) / "model.pt").write_bytes(b"")
    from trainflow.errors import CheckpointError

    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        select(outcome, cfg)
