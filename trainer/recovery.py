"""A run's recovery log: worker-group failures, hangs and resumes, one small JSON file per event.

Ray Train's controller calls RecoveryLog.after_exception when a worker group fails; rank 0 of the
next attempt appends a resume event when it starts from a checkpoint. Read back, each failure is
paired with the epoch that the run resumed from.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from ray.train import UserCallback

from trainflow.storage import join, list_dir, read_text, write_text

if TYPE_CHECKING:
    from trainflow.config import Config

EVENTS_DIR = "trainflow_events"


def append_event(run_dir: str, event: dict[str, Any]) -> None:
    """Record an event under <run_dir>/trainflow_events/ (local or a storage URI; object stores cannot append)."""
    now = time.time()
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    write_text(join(run_dir, EVENTS_DIR, name), json.dumps({"time": now, **event}))


def read_events(run_dir: str) -> list[dict[str, Any]]:
    """The run's events in the order they happened."""
    folder = join(run_dir, EVENTS_DIR)
    events = []
    for name, is_dir in sorted(list_dir(folder)):
        if is_dir or not name.endswith(".json"):
            continue
        try:
            events.append(json.loads(read_text(join(folder, name))))
        except (OSError, json.JSONDecodeError):  # a file cut short by a killed process
            continue
    return events


def recoveries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """[{error, resumed_from_epoch}] — one per resume; a resume with no error before it followed a killed process."""
    out, pending = [], None
    for e in events:
        if e.get("event") in ("error", "hang"):
            # a hang is logged by the watchdog before Ray reports the killed worker; keep the first cause
            pending = e["error"] if pending is None else pending
        elif e.get("event") == "resume":
            out.append(
                {
                    "error": pending
                    or "the previous attempt ended without reporting an error (process or node killed)",
                    "resumed_from_epoch": e["epoch"],
                }
            )
            pending = None
    return out


def started_from(events: list[dict[str, Any]]) -> int | None:
    """The first epoch resumed from among an invocation's events (None if none resumed)."""
    for e in events:
        if e.get("event") == "resume":
            return e["epoch"]
    return None


class RecoveryLog(UserCallback):
    """Records each worker-group failure that Ray Train handles (or gives up on). It runs in Ray Train's controller,
    a process of its own: it waits out an absent object store as the run's config says (services.storage_wait_s),
    not for the default."""

    def __init__(self, run_dir: str, config: Config | None = None):
        self.run_dir, self.config = run_dir, config

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        if self.config is not None:
            from trainflow.config import apply_to_process

            apply_to_process(self.config)
        rank, exc = sorted(worker_exceptions.items())[0]
        msg = str(exc).strip().splitlines()
        detail = next((ln for ln in reversed(msg) if ln.strip()), type(exc).__name__)
        append_event(self.run_dir, {"event": "error", "error": f"worker {rank}: {type(exc).__name__}: {detail}"[:500]})
