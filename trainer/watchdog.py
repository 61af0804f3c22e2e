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

from trainer.recovery import append_event

_current: Watchdog | None = None


def heartbeat(where: str | None = None) -> None:
    """Mark progress (a block or mini-batch arrived, a report returned); a no-op outside a watched worker."""
    if _current is not None:
        _current.beat(where)


class Watchdog:
    def __init__(self, timeout_s: float, run_dir: str | None, rank: int):
        self.timeout_s, self.run_dir, self.rank = timeout_s, run_dir, rank
        self.last, self.where = time.monotonic(), "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainflow-watchdog", daemon=True)

    def beat(self, where: str | None = None) -> None:
        self.last = time.monotonic()
        if where is not None:
            self.where = where

    def _watch(self) -> None:
        while not self._stop.wait(min(5.0, self.timeout_s / 4)):
            idle = time.monotonic() - self.last
            if idle > self.timeout_s:
                if self.run_dir:
                    append_event(self.run_dir, {
                        "event": "hang", "rank": self.rank,
                        "error": f"worker {self.rank}: no progress for {idle:.0f} s (hang_timeout_s={self.timeout_s:g}) "
                                 f"after {self.where}; killed so that Ray Train restarts the worker group",
                    })
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
    """A train function run under a Watchdog (picklable, so Ray can ship it to the workers)."""

    def __init__(self, train_fn: Callable[[dict[str, Any]], Any], timeout_s: float | None):
        self.train_fn, self.timeout_s = train_fn, timeout_s

    def __call__(self, loop_config: dict[str, Any]) -> Any:
        if not self.timeout_s:
            return self.train_fn(loop_config)
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        with Watchdog(self.timeout_s, loop_config.get("run_dir"), rank):
            return self.train_fn(loop_config)
