"""What the gradient-boosted tree families share: the budget in rounds, a worker's shard as arrays, and the round loop
(resume, early stopping, reports, checkpoints, the deadline) that XGBoost and LightGBM run inside their own training.

Each worker reads its Ray Data shard of the packed training rows into a matrix and the whole validation
split (every rank then computes the same validation loss, so all stop at the same round); the libraries'
own distributed training (XGBoost's collective, LightGBM's network from get_network_params) builds one
model. A round is trainflow's "epoch": checkpoints, resume, history and selection work as for the torch
families. Embedded text columns reach the trees as native categorical features (their integer codes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import ray.train

from trainflow.config import Config, ModelSection, ScalingSection
from trainflow.preprocessors.tabular import FEATURES, LABEL, TabularPreprocessor
from trainflow.trainer import session
from trainflow.trainer.budget import Budget, EarlyStopping
from trainflow.trainer.serving.checkpoint import read_metrics, warm_files, warm_record, write_common
from trainflow.trainer.metrics import compute_metrics
from trainflow.trainer.reporting import record_start, report_step
from trainflow.trainer.steps import Steps
from trainflow.trainer.watchdog import heartbeat

STATE_JSON = "train_state.json"
DECISION_S = 0.25  # how often (in training time) ranks agree whether a report is due


def _agree(decision: list[int]) -> list[int]:
    from ray.train.collective import broadcast_from_rank_zero

    return list(broadcast_from_rank_zero(decision))


def boost_budget(model: ModelSection) -> Budget:
    """A booster's budget: model.params' rounds and early stopping."""
    patience = model.params.early_stopping_rounds
    return Budget("round", model.params.num_boost_round, None if patience == "off" else int(patience))


def worker_threads(scaling: ScalingSection) -> int:
    """One library thread per CPU the worker holds (Ray's default: 1)."""
    return max(1, int((scaling.resources_per_worker or {}).get("CPU", 1)))


def shard_arrays(shard) -> tuple[np.ndarray, np.ndarray]:
    """A worker's Ray Data shard of packed rows as (features, labels) arrays."""
    xs, ys = [], []
    for batch in shard.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=1):
        heartbeat()
        xs.append(np.asarray(batch[FEATURES], dtype=np.float32))
        ys.append(np.asarray(batch[LABEL]))
    if not xs:
        return np.zeros((0, 0), np.float32), np.zeros((0,), np.float32)
    return np.concatenate(xs), np.concatenate(ys)


class RoundReporter:
    """A booster's callback per boosting round, on the shared step runner (trainer/steps.py): the round's row, early
    stopping on the validation loss, and the reports it decides (a report of the best round since the last one is the
    model cut at that round: nothing is captured)."""

    def __init__(
        self,
        loop_config: dict[str, Any],
        family: str,
        prep: TabularPreprocessor,
        budget: Budget,
        start_round: int,
        history: list[dict[str, float]],
        stopper: EarlyStopping,
        y_val: np.ndarray,
        save: Callable[[Any, int, Path], None],
        predict: Callable[[Any, int], np.ndarray],
        offset: int = 0,
    ):
        self.loop_config, self.family, self.prep, self.offset = loop_config, family, prep, offset
        self.cfg: Config = loop_config["config"]
        self.y_val, self.save, self.predict = y_val, save, predict
        ctx = ray.train.get_context()
        self.rank, self.workers = ctx.get_world_rank(), ctx.get_world_size()
        self.steps = Steps(
            loop_config,
            "round",
            start_round,
            budget.limit,
            history,
            stopper,
            rank=self.rank,
            agree=_agree if self.workers > 1 else list,
            decide_every_s=DECISION_S,
        )

    def after_round(self, model: Any, rnd: int, train_loss: float, val_loss: float) -> bool:
        """Record round rnd; report when due; True when training should stop."""
        heartbeat(f"boosting round {rnd}")
        row = {
            "epoch": rnd,
            "train_loss": float(train_loss),
            "val_loss": float(val_loss),
            "epoch_time_s": self.steps.step_time(),
            "workers": self.workers,
        }
        return self.steps.after(
            rnd, row, lambda _, step, limited: self._report(model, step, limited), last=not math.isfinite(val_loss)
        )

    def _report(self, model: Any, rnd: int, limited: bool) -> None:
        """One Ray Train report of the model cut at round rnd, with its checkpoint from rank 0 (limited: the last,
        the run's time share spent)."""
        history = [h for h in self.steps.history if h["epoch"] <= rnd]
        metrics: dict[str, Any] = self.steps.limited({"epoch": rnd}, rnd, limited)
        if self.rank == 0:
            out = self.predict(model, rnd)
            metrics.update(compute_metrics(self.prep.task, out, self.y_val, self.prep))
            metrics["train_loss"] = float(history[-1]["train_loss"])
        stopper = self.steps.stopper

        def write(folder: str) -> None:
            self.save(model, rnd, Path(folder))
            state = {
                "epoch": rnd,
                "seed": self.cfg.split.seed,
                "early_stopping": stopper.state(),
                "family": self.family,
                **({"warm_offset": self.offset} if self.offset else {}),
            }
            (Path(folder) / STATE_JSON).write_text(json.dumps(state))
            write_common(
                folder,
                rnd,
                metrics,
                history,
                self.loop_config["preprocessor"],
                self.cfg.to_dict(),
                self.loop_config.get("lineage"),
                warm_record(self.loop_config),
            )

        report_step(metrics, self.rank, write, self.cfg, self.loop_config.get("run_dir") or "")
        heartbeat(f"the report of round {rnd}")


@dataclass
class BoostRun:
    """What a booster worker starts from: its data, budget, and the latest checkpoint's model and state."""

    loop_config: dict[str, Any]
    prep: TabularPreprocessor
    x: np.ndarray | None  # None: the family reads its shards itself (XGBoost's external memory)
    y: np.ndarray | None
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    budget: Budget
    model: Any  # the checkpoint's booster to continue from, or None
    start: int  # the first round to boost
    history: list[dict[str, float]]
    stopper: EarlyStopping
    offset: int = 0  # a warm start's: the source model's rounds, before this fit's round 0 (train.warm_start)

    def reporter(
        self, family: str, save: Callable[[Any, int, Path], None], predict: Callable[[Any, int], np.ndarray]
    ) -> RoundReporter:
        return RoundReporter(
            self.loop_config,
            family,
            self.prep,
            self.budget,
            self.start,
            self.history,
            self.stopper,
            self.y_val,
            save,
            predict,
            self.offset,
        )


def prepare(loop_config: dict[str, Any], load_model: Callable[[Path], Any]) -> BoostRun | None:
    """Read this worker's data (unless the budget says external memory) and resume from
    session.get_checkpoint(); None when nothing is left to boost."""
    cfg: Config = loop_config["config"]
    ctx = ray.train.get_context()
    budget = replace(boost_budget(cfg.model), external_memory=bool(loop_config.get("external_memory")))
    stopper = EarlyStopping("min", budget.patience, cfg.train.early_stopping.min_delta)
    model, start, history, offset = None, 0, [], 0
    checkpoint = session.get_checkpoint()
    warm = loop_config.get("warm_start")
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            model = load_model(Path(d))
            state = json.loads((Path(d) / STATE_JSON).read_text())
            stopper.load(state["early_stopping"])
            history = read_metrics(d)["history"]
        start, offset = int(state["epoch"]) + 1, int(state.get("warm_offset", 0))
    elif warm:  # train.warm_start: boost on from the source model's rounds (tasks/warm.py shipped its files)
        with warm_files(warm) as d:
            model = load_model(d)
        offset = int(warm["offset"])
    record_start(
        loop_config, ctx.get_world_rank(), start, checkpoint is not None, external_memory=budget.external_memory
    )
    if stopper.should_stop or start >= budget.limit:
        return None
    prep = TabularPreprocessor.from_dict(loop_config["preprocessor"])
    x = y = x_val = y_val = None
    if not budget.external_memory:
        x, y = shard_arrays(session.dataset_shard("train"))
        x_val, y_val = shard_arrays(session.dataset_shard("val"))
    if start == 0 and ctx.get_world_rank() == 0:
        rows = session.train_rows(loop_config, prep.train_rows)
        print(f"trainflow budget: {budget.to_dict()} over {rows} training rows")
    return BoostRun(loop_config, prep, x, y, x_val, y_val, budget, model, start, history, stopper, offset)
