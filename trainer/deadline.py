"""One time budget for a run's training (train.time_limit): the driver shares it out over the runs of every family and
fold, and each run's workers stop adding epochs or rounds when their share is spent, keeping the best so far.

The driver sets each run's deadline on its process's deadline board (by the run's folder: in the driver's process for a
fit in it, a Ray actor for a worker group's) before the fit starts, and again while it trains when the deadline moves
(auto: once the first family's runs end); the fit's loop config carries the board, and rank 0 asks it at most every
CHECK_S seconds and hands its decision to the other ranks with the report decision they already agree on, so every
rank stops after the same epoch or round; the report of that step carries TIME_LIMITED, so the result says where the
time ran out. AutoGluon shares its time_limit the same way: each model what remains, each bagged fold its part of it;
a model that cannot start in time is left out and says so.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray

from trainflow.limits import AUTO_FLOOR_S, MIN_RUN_S

CHECK_S = 5.0  # how often a run's rank 0 asks for its deadline
TIME_LIMITED = "time_limited_at"  # the metric of the report after which a run's share of the time ran out


class _Board:
    """Every deadline the driver process set, by run folder (seconds since the epoch, or None, and why)."""

    def __init__(self) -> None:
        self.deadlines: dict[str, tuple[float | None, str]] = {}

    def set(self, key: str, ends_at: float | None, why: str) -> None:
        self.deadlines[key] = (ends_at, why)

    def get(self, key: str) -> tuple[float | None, str]:
        return self.deadlines.get(key, (None, ""))


_BOARD: list[tuple[tuple[str, str], Any]] = []  # ((the Ray session), its board's handle): one per process and session
_BOARD_LOCK = threading.Lock()
# every deadline this process set, by run folder: what a fit in this process (Ray Train's local mode) reads, and what a
# board started later for a worker group's fit begins with
_DEADLINES: dict[str, tuple[float | None, str]] = {}
LOCAL_BOARD = "trainflow-this-process"  # a loop config's board for a fit in the driver's own process: _DEADLINES


def deadline_board(create: bool = False, replace=None):
    """This process's deadline board in the Ray it is connected to (create: started if there is none, holding every
    deadline set so far; else None): one actor (no CPU, on the caller's node) for every worker group's fit the
    process runs, as the progress queue is. replace: a board that died (its node left the cluster): a new one is
    started in its place."""
    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    session = (context.gcs_address, context.get_job_id())
    with _BOARD_LOCK:
        if _BOARD and _BOARD[0][0] == session and _BOARD[0][1] is not replace:
            return _BOARD[0][1]
        if not create:
            return None
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # pinned to the caller's node (as Ray Data pins its coordinator): a worker node that leaves the cluster must
        # not take the board with it, and the caller's node going takes the caller too
        here = NodeAffinitySchedulingStrategy(node_id=context.get_node_id(), soft=False)
        board = ray.remote(num_cpus=0, scheduling_strategy=here)(_Board).remote()
        ray.get([board.set.remote(k, *v) for k, v in _DEADLINES.items()])
        _BOARD[:] = [(session, board)]
        return board


def fit_board(local: bool):
    """The board a fit's loop config carries: this process's own deadlines for a fit in it (local mode: no Ray
    needed), else the actor a worker group asks (started here with every deadline set so far; None where this
    process set none: a sweep's trial)."""
    return LOCAL_BOARD if local else deadline_board(create=bool(_DEADLINES))


def set_deadline(run_dir: str, ends_at: float | None, why: str = "") -> None:
    """The deadline of the run in run_dir (seconds since the epoch; None: none), for its workers to ask for: recorded
    in this process, and on the board a worker group asks where one is running."""
    with _BOARD_LOCK:
        _DEADLINES[run_dir] = (ends_at, why)
    board = deadline_board()
    if board is None:
        return
    try:
        ray.get(board.set.remote(run_dir, ends_at, why))
    except ray.exceptions.RayActorError:  # the board died with the process's earlier runs: a new one for this one
        deadline_board(create=True, replace=board)


def board_set(board, run_dir: str, ends_at: float | None, why: str) -> None:
    """A deadline set from inside a fit (a shared run's auto rule) on the board its loop config carries."""
    if board == LOCAL_BOARD:
        set_deadline(run_dir, ends_at, why)
    else:
        ray.get(board.set.remote(run_dir, ends_at, why), timeout=30)


def _ask(board, run_dir: str) -> tuple[float | None, str] | None:
    """What board holds for run_dir (ends_at: a finite number or None, why), or None when it does not answer."""
    try:
        if board == LOCAL_BOARD:
            ends_at, why = _DEADLINES.get(run_dir, (None, ""))
        else:
            ends_at, why = ray.get(board.get.remote(run_dir), timeout=CHECK_S)
    except Exception:  # noqa: BLE001 - a board gone or not answering: no deadline, never a failed run
        return None
    return (float(ends_at) if isinstance(ends_at, (int, float)) and math.isfinite(ends_at) else None), str(why)


def deadline_entry(run_dir: str) -> tuple[float | None, str] | None:
    """What the driver's board holds for run_dir now (ends_at, why): the actor's, where a worker group's fit may have
    moved it, else this process's own; None when neither has an entry."""
    board = deadline_board()
    if board is None:
        return _ask(LOCAL_BOARD, run_dir) if run_dir in _DEADLINES else None
    return _ask(board, run_dir)


class Deadline:
    """A run's deadline as its rank 0 sees it: asked of the driver's board (deadline_board) for the run's folder, at
    most every CHECK_S seconds. No board, no entry or a board that does not answer is no deadline (a fit outside the
    retrain flow; the driver gone, whose run ends with it).

    share: the folds left in the run with this one (trainer/session.py): they train one after another, so this one
    gets its part of the time left when it starts, 1/share of it."""

    def __init__(self, board, run_dir: str | None, clock: Callable[[], float] = time.time, share: int = 1):
        self.board, self.run_dir, self.clock = board, run_dir, clock
        self.started, self.share = clock(), max(1, int(share))
        self.ends_at: float | None = None
        self.why = ""
        self.read_at = -math.inf

    def _refresh(self) -> None:
        now = time.monotonic()
        if self.board is None or not self.run_dir or now - self.read_at < CHECK_S:
            return
        self.read_at = now
        ends_at, why = _ask(self.board, self.run_dir) or (None, self.why)
        self.ends_at = None if ends_at is None else self.started + (ends_at - self.started) / self.share
        self.why = why[:200]

    def passed(self, margin_s: float = 0.0) -> bool:
        """Whether the deadline falls within margin_s from now (the time the next step would take)."""
        self._refresh()
        return self.ends_at is not None and self.clock() + max(0.0, margin_s) >= self.ends_at


@dataclass
class TimeShare:
    """The driver's side: train.time_limit shared out over the runs (family x fold), in the order they start.

    limit: seconds for all of the training, "auto" (no limit until the first family's runs end, after T1 seconds;
    then the others share max(T1, AUTO_FLOOR_S - T1): the whole training takes at most max(2 T1, AUTO_FLOOR_S), so a
    large table's default run stays within twice its first family's time, and a small one trains every family), or
    "off". As AutoGluon shares its time_limit: a family may use all the time left, each of its runs the time
    left over the waves of its own runs still to start (at_once run side by side); runs that stop early leave their
    time to the next family, so the order of the families is their priority. A family whose runs would get less than
    MIN_RUN_S each is left out, except the first (a run must end with a model)."""

    limit: float | str
    families: list[str]
    at_once: int
    clock: Callable[[], float] = time.time
    reserve: float = 0.0  # the share of a limit in seconds kept for after the families (train.refit: REFIT_RESERVE)
    started: float = field(init=False)
    # when the families' training ends (the limit less what it keeps for after them: the backtest's fit ends here too);
    # limit_ends_at is the whole budget's end (the refit's)
    ends_at: float | None = field(init=False, default=None)
    why: str = field(init=False, default="")
    first_done_s: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.started = self.clock()
        if isinstance(self.limit, (int, float)):
            self.ends_at = self.started + float(self.limit) * (1.0 - self.reserve)
            self.why = f"train.time_limit {float(self.limit):g} s"

    @property
    def limit_ends_at(self) -> float | None:
        """When the whole budget ends: a limit in seconds with what it keeps (reserve) included, auto's once the first
        family has set it; None for off."""
        return self.started + float(self.limit) if isinstance(self.limit, (int, float)) else self.ends_at

    def run_deadline(self, family_runs_left: int) -> float | None:
        """The deadline of a run starting now; family_runs_left counts it and its family's runs not started yet."""
        if self.ends_at is None:
            return None
        now = self.clock()
        waves = max(1, math.ceil(family_runs_left / max(1, self.at_once)))
        return now + max(0.0, self.ends_at - now) / waves

    def too_late(self, family: str, family_runs: int) -> str | None:
        """Why family (whose family_runs runs start next) is left out, or None to start it."""
        deadline = self.run_deadline(family_runs)
        if deadline is None or family == self.families[0]:
            return None
        share = deadline - self.clock()
        if share >= MIN_RUN_S:
            return None
        left = max(0.0, self.ends_at - self.clock())
        return (
            f"{self.why}: {left:.0f} s were left, about {max(0.0, share):.0f} s for each of its {family_runs} run(s), "
            f"under the {MIN_RUN_S:.0f} s a run needs to start and train"
        )

    def first_family_ended(self) -> bool:
        """auto: the first family's runs have all ended; the others get their shared deadline. True when it moved."""
        if self.limit != "auto" or self.first_done_s is not None:
            return False
        now = self.clock()
        self.first_done_s = now - self.started
        share = max(self.first_done_s, AUTO_FLOOR_S - self.first_done_s)
        self.ends_at = now + share
        self.why = (
            f"train.time_limit auto ({self.families[0]} trained in {self.first_done_s:.0f} s, so the other "
            f"families share {share:.0f} s: training takes at most max(twice the first family's time, "
            f"{AUTO_FLOOR_S:.0f} s))"
        )
        return True

    def record(self) -> dict[str, Any]:
        """For the summary: the limit, how it was shared, and how long training took."""
        return {
            "time_limit": self.limit,
            "training_s": round(self.clock() - self.started, 1),
            "first_family_s": None if self.first_done_s is None else round(self.first_done_s, 1),
            "rule": self.why or None,
            **({"kept_for_refit_s": round(float(self.limit) * self.reserve, 1)} if self.reserve else {}),
        }
