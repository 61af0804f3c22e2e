"""One time budget for a run's training (train.time_limit): the driver shares it out over the runs of every family and
fold, and each run's workers stop adding epochs or rounds when their share is spent, keeping the best so far.

The driver writes each run's deadline into the run's folder (DEADLINE_FILE) before the fit starts, and again while it
trains when the deadline moves (auto: once the first family's runs end); rank 0 reads it at most every CHECK_S
seconds and hands its decision to the other ranks with the report decision they already agree on, so every rank stops
after the same epoch or round. AutoGluon shares its time_limit the same way: each model what remains, each bagged
fold its part of it; a model that cannot start in time is left out and says so.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from trainflow.limits import AUTO_FLOOR_S, MIN_RUN_S
from trainflow.storage import join, read_text, write_text

DEADLINE_FILE = "trainflow_deadline.json"
CHECK_S = 5.0  # how often a run's rank 0 reads its deadline


def write_deadline(run_dir: str, ends_at: float | None, why: str = "") -> None:
    """The run's deadline (seconds since the epoch; None: none) for its workers to read."""
    write_text(join(run_dir, DEADLINE_FILE), json.dumps({"ends_at": ends_at, "why": why}))


class Deadline:
    """A run's deadline as its rank 0 sees it: read from the run's folder, at most every CHECK_S seconds. A missing or
    unreadable file is no deadline (a run started by an older driver, or outside the retrain flow).

    share: the folds left in the run with this one (trainer/session.py): they train one after another, so this one
    gets its part of the time left when it starts, 1/share of it."""

    def __init__(self, run_dir: str | None, clock: Callable[[], float] = time.time, share: int = 1):
        self.run_dir, self.clock = run_dir, clock
        self.started, self.share = clock(), max(1, int(share))
        self.ends_at: float | None = None
        self.why = ""
        self.read_at = -math.inf

    def _refresh(self) -> None:
        now = time.monotonic()
        if not self.run_dir or now - self.read_at < CHECK_S:
            return
        self.read_at = now
        try:
            record = json.loads(read_text(join(self.run_dir, DEADLINE_FILE)))
            ends_at = record.get("ends_at")
            ends_at = float(ends_at) if isinstance(ends_at, (int, float)) and math.isfinite(ends_at) else None
            self.ends_at = None if ends_at is None else self.started + (ends_at - self.started) / self.share
            self.why = str(record.get("why", ""))[:200]
        except (OSError, ValueError, AttributeError):
            self.ends_at = None

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
    started: float = field(init=False)
    ends_at: float | None = field(init=False, default=None)
    why: str = field(init=False, default="")
    first_done_s: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.started = self.clock()
        if isinstance(self.limit, (int, float)):
            self.ends_at = self.started + float(self.limit)
            self.why = f"train.time_limit {float(self.limit):g} s"

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
        }
