"""The one step runner every family's training loop runs by: the torch loop's epochs, XGBoost's and LightGBM's boosting
rounds (from inside the library's own loop, as its callback), CatBoost's rounds and the extra-trees forest's rounds.

A family supplies its step (it trains one epoch or round and hands over the step's row: losses, validation metrics,
timings), its state (`capture`: what a checkpoint of this step needs, taken when the step is the best so far or is
reported) and its checkpoint (`report`: one Ray Train report of a captured state). The runner owns the rest, alike for
every family: the history, early stopping, when a step is reported (ReportSchedule: the last step, or once
checkpoint.min_interval_s has passed, the best step since the previous report first), the run's deadline (rank 0's,
from the deadline board; the step it ended at comes back with the result as TIME_LIMITED), the progress reports of a
family that checkpoints once at the end, and the log lines (early stopping, the time limit).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from trainflow.trainer import session
from trainflow.trainer.deadline import TIME_LIMITED, Deadline

STOP_REASON = "stop_reason"  # a report's key: the run ended because its training loss is not finite (the reason)

# (the captured state of a step, the step, whether the run's time ran out there) -> one Ray Train report
Report = Callable[[Any, int, bool], None]


class ReportSchedule:
    """When a step is reported; the same answer on every rank, which must all make the same report calls.

    Rank 0 decides and `agree` (a broadcast from rank 0 of a list of ints) hands its decision to the others, at most
    every `decide_every_s` of training: boosting rounds are too short to broadcast after each (0: after every step).
    With a deadline (rank 0's; trainer/deadline.py) the same decision says when the run's time share is spent: that
    step is reported and is the last (`expired`), on every rank alike.
    """

    def __init__(
        self,
        min_interval_s: float,
        start: int,
        agree: Callable[[list[int]], list[int]],
        decide_every_s: float = 0.0,
        deadline: Callable[[float], bool] | None = None,
    ):
        self.min_interval, self.agree, self.decide_every = float(min_interval_s), agree, decide_every_s
        self.deadline = deadline  # rank 0 only: whether the time share ends within the given seconds
        self.reported = start - 1  # steps up to here are in a checkpoint already (the one resumed from)
        self.last_report = self.last_decision = time.monotonic()
        self.next_decision = start
        self.expired = False

    def due(self, step: int, last: bool, next_step_s: float = 0.0) -> bool:
        """Whether step is reported now. last: this is the final step (budget spent, early stop or a failed loss),
        known alike on every rank. next_step_s: how long the next step would take (a step that cannot end before the
        deadline is not started)."""
        if not last and step < self.next_decision:
            return False
        now = time.monotonic()
        per_step = (now - self.last_decision) / max(1, step - self.next_decision + 1)
        stride = max(1, int(self.decide_every / max(per_step, 1e-6))) if self.decide_every else 1
        expired = bool(self.deadline and not last and self.deadline(next_step_s))
        if stride > 1 and not (last or expired) and self.deadline and self.deadline(next_step_s + stride * per_step):
            stride = 1  # the share ends within the stride: a decision after each step, not up to decide_every_s past it
        due, stride, expired = self.agree(
            [int(last or expired or now - self.last_report >= self.min_interval), stride, int(expired)]
        )
        self.last_decision, self.next_decision, self.expired = now, step + stride, bool(expired)
        return bool(due)

    def to_report(self, step: int, best_step: int | None) -> list[int]:
        """The steps a due report covers, in order: the best since the previous report (when it is not step itself)
        and step."""
        return ([best_step] if best_step is not None and self.reported < best_step < step else []) + [step]

    def reported_through(self, step: int) -> None:
        self.reported, self.last_report = step, time.monotonic()


def rank_zero_deadline(loop_config: dict[str, Any], rank: int) -> Callable[[float], bool] | None:
    """Rank 0's view of the run's deadline (the other ranks follow its decision); None on the other ranks."""
    run_dir, board = loop_config.get("deadline_dir") or loop_config.get("run_dir"), loop_config.get("deadline_board")
    if rank != 0 or not run_dir or board is None:
        return None
    return Deadline(board, run_dir, share=loop_config.get("folds_left", 1)).passed


class Steps:
    """One training run's steps on one worker, from `start` (0, or the step after the checkpoint resumed from) to at
    most `limit` steps. `unit`: what a step is called in the log ("epoch", "round", "tree round").

    `stopper` (an EarlyStopping on `metric`, resumed from the checkpoint) ends the run early and decides which step is
    the best; without one (a family whose library stops early itself, or a forest's fixed rounds) the runner sends
    progress reports only and the family reports its one checkpoint at the end (`limited_at` then says whether the
    run's time ran out, and where). Every rank runs the same steps and makes the same report calls (`agree`: rank 0's
    decision on every rank, taken at most every `decide_every_s` of training)."""

    def __init__(
        self,
        loop_config: dict[str, Any],
        unit: str,
        start: int,
        limit: int,
        history: list[dict[str, Any]],
        stopper: Any = None,
        *,
        rank: int = 0,
        agree: Callable[[list[int]], list[int]] = list,
        decide_every_s: float = 0.0,
        metric: str = "val_loss",
    ):
        self.unit, self.limit, self.history = unit, limit, history
        self.stopper, self.rank, self.metric = stopper, rank, metric
        self.schedule = ReportSchedule(
            loop_config["config"].checkpoint.min_interval_s,
            start,
            agree,
            decide_every_s,
            rank_zero_deadline(loop_config, rank),
        )
        # (step, captured state) of the best step since the last report, kept until that report
        self.pending: tuple[int, Any] | None = None
        self.limited_at: int | None = None  # the step at which the run's share of train.time_limit ran out
        self.step_began = time.perf_counter()

    @property
    def finished(self) -> bool:
        """Nothing is left to train: early stopping ended the run already (a resumed checkpoint's state)."""
        return bool(self.stopper is not None and self.stopper.should_stop)

    def step_time(self) -> float:
        """Seconds since the previous step ended (or the runner started): this step's time, for its row."""
        now = time.perf_counter()
        spent, self.step_began = now - self.step_began, now
        return spent

    def after(
        self,
        step: int,
        row: dict[str, Any],
        report: Report | None = None,
        capture: Callable[[], Any] = lambda: None,
        last: bool = False,
        next_step_s: float = 0.0,
    ) -> bool:
        """Step `step` is trained: its row goes into the history, early stopping sees its metric, and it is reported
        when due (with report and capture; without report, a progress report of the row). last: the family knows this
        step is its final one (e.g. a non-finite loss); the runner adds the budget's end and early stopping.
        next_step_s: how long the next step would take (one that cannot end before the deadline is not started).
        True when the run ends here."""
        session.check_stop()
        self.history.append(row)
        improved = False
        if self.stopper is not None:
            improved = self.stopper.update(row.get(self.metric, float("nan")), step)
        last = last or step >= self.limit - 1 or self.finished
        due = self.schedule.due(step, last, next_step_s)
        if report is None:  # progress only: the family reports its checkpoint once, at the end
            if due and not last:
                self.schedule.reported_through(step)
                session.report(dict(row))
        elif due:
            for earlier in self.schedule.to_report(step, self.stopper.best_epoch if self.stopper else None):
                if earlier != step and self.pending is not None:
                    report(self.pending[1], self.pending[0], False)
            self.pending = None
            report(capture(), step, self.schedule.expired)
            self.schedule.reported_through(step)
        elif improved:
            self.pending = (step, capture())
        expired = self.schedule.expired and not last
        if expired:
            self.limited_at = step
            if self.rank == 0:
                print(
                    f"trainflow time limit: the run's share of train.time_limit is spent; stopping after {self.unit} "
                    f"{step} with the best so far"
                )
        if last and self.rank == 0 and self.finished:
            s = self.stopper
            print(
                f"trainflow early stopping at {self.unit} {step}: {self.metric} has not improved for {s.bad_epochs} "
                f"{self.unit}(s); best {s.best:.6g} at {self.unit} {s.best_epoch}"
            )
        return last or expired

    def diverged(self, step: int, row: dict[str, Any], reason: str, report: Report) -> None:
        """The run ends at step because its training loss is not finite: the best step since the last report is
        reported with its checkpoint, then this step's row with the reason and no checkpoint (reported, not raised:
        Ray Train's FailureConfig would retry it, and a NaN does not heal)."""
        if self.pending is not None:
            report(self.pending[1], self.pending[0], False)
            self.pending = None
        session.report({**row, STOP_REASON: reason}, checkpoint=None)

    @staticmethod
    def limited(metrics: dict[str, Any], step: int, limited: bool) -> dict[str, Any]:
        """A report's metrics, with TIME_LIMITED where the run's time ran out at this step."""
        return {**metrics, TIME_LIMITED: step} if limited else metrics
