"""A per-worker hang watchdog: a worker that makes no progress for timeout_s kills its own process.

A stalled streaming_split or a worker stuck outside Ray's control never raises, so FailureConfig
never sees it. Killing the process turns the hang into an ordinary worker failure: Ray Train
restarts the worker group from the latest reported checkpoint, and once max_failures is spent
TorchTrainer.fit raises into the Prefect task's retry, which resumes the same run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

from trainflow.config import apply_to_process
from trainflow.limits import HANG_FACTOR, HANG_FIRST_S, HANG_MIN_S
from trainflow.trainer.recovery import append_event

_current: Watchdog | None = None


def heartbeat(where: str | None = None, startup: bool = False) -> None:
    """Mark progress (a block or mini-batch arrived, a report returned); a no-op outside a watched worker.
    startup: a mark still inside start-up (an attempt's first epoch begins, its data pipeline not yet producing),
    which keeps start-up's allowance until the first real step."""
    if _current is not None:
        _current.beat(where, startup)


def timeout_label(seconds: float | None) -> str:
    return "auto" if seconds is None else f"{seconds:g}"


class Watchdog:
    """timeout_s: seconds, or "auto" (measured: HANG_FACTOR x the longest gap between progress marks so far,
    at least HANG_MIN_S). Start-up, until the first mark, gets at least HANG_FIRST_S either way: a process group's
    set-up on a loaded machine is not a stalled step, and killing it would restart the attempt from nothing."""

    def __init__(self, timeout_s: float | str, run_dir: str | None, rank: int):
        self.auto = timeout_s == "auto"
        self.steady_s = None if self.auto else float(timeout_s)
        self.timeout_s = HANG_FIRST_S if self.auto else max(HANG_FIRST_S, float(timeout_s))
        self.run_dir, self.rank = run_dir, rank
        self.last, self.where = time.monotonic(), "start"
        self.longest_gap: float | None = None
        self.started = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainflow-watchdog", daemon=True)

    def beat(self, where: str | None = None, startup: bool = False) -> None:
        now = time.monotonic()
        if startup and not self.started:
            self.last = now
            if where is not None:
                self.where = where
            return
        if self.auto and self.started:  # the wait for the first mark is start-up, not a step
            gap = now - self.last
            self.longest_gap = gap if self.longest_gap is None else max(self.longest_gap, gap)
            self.timeout_s = max(HANG_MIN_S, HANG_FACTOR * self.longest_gap)
        elif self.steady_s is not None:
            self.timeout_s = self.steady_s
        self.started = True
        self.last = now
        if where is not None:
            self.where = where

    def _watch(self) -> None:
        while not self._stop.wait(min(5.0, self.timeout_s / 4)):
            idle = time.monotonic() - self.last
            if idle > self.timeout_s:
                if self.run_dir:
                    label = f"{self.timeout_s:g}" if self.started else timeout_label(self.steady_s)
                    if not self.started:
                        measured = f"; start-up, before the first step, is allowed at least {HANG_FIRST_S:g} s"
                    elif self.auto:
                        measured = (
                            f"; auto: {HANG_FACTOR:g} x the longest gap so far, "
                            f"{self.longest_gap or 0:.1f} s, at least {HANG_MIN_S:g} s"
                        )
                    else:
                        measured = ""
                    append_event(
                        self.run_dir,
                        {
                            "event": "hang",
                            "rank": self.rank,
                            "error": f"worker {self.rank}: no progress for {idle:.0f} s (hang_timeout_s={label}"
                            f"{measured}) after {self.where}; killed so that Ray Train restarts the worker group",
                        },
                    )
                os.kill(os.getpid(), signal.SIGKILL)

    def __enter__(self) -> Watchdog:
        global _current
        _current = self
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        global _current
        self._stop.set()
        _current = None


class Watched:
    """A train function run under a Watchdog (picklable, so Ray can ship it to the workers), in a worker that waits
    out absent services as the run's config says (services.*: an object store away while a checkpoint is written)
    and masks the config's secrets in its log lines."""

    def __init__(self, train_fn: Callable[[dict[str, Any]], Any], timeout_s: float | str | None):
        self.train_fn, self.timeout_s = train_fn, timeout_s

    def __call__(self, loop_config: dict[str, Any]) -> Any:
        if loop_config.get("config") is not None:
            apply_to_process(loop_config["config"])
        if not self.timeout_s:
            return self.train_fn(loop_config)
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        with Watchdog(self.timeout_s, loop_config.get("run_dir"), rank):
            return self.train_fn(loop_config)
