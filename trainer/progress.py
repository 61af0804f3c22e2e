"""Progress while a fit runs: Ray Train's controller hands each report's metrics to the process that called fit.

ProgressCallback runs on the controller (a UserCallback) and puts the reported metrics on a ray.util.queue.Queue;
watch_progress passes them on, on a thread of the calling process while fit() blocks, so the train task can print a
line per report and log the metrics to MLflow as they arrive instead of after the fit. One queue (one actor) serves
every fit a process runs on one Ray session, families and folds side by side included: each fit's reports carry its
route and go to its own on_report, so a fit does not start another actor process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from queue import Empty
from typing import Any

import ray
from ray.train import UserCallback
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

log = logging.getLogger(__name__)
SHOWN = ("train_loss", "val_loss", "val_accuracy", "val_f1", "val_roc_auc", "val_rmse", "val_mae", "val_r2")
ROUTE, END = "_progress_route", "_progress_end"  # which watch_progress block a report goes to; that block's last item


class ProgressCallback(UserCallback):
    """On Ray Train's controller: each report's metrics (the fullest worker's: a booster's rank 0) to the queue,
    with `tag` added (its route, and a tune trial's id and family)."""

    def __init__(self, queue: Queue, tag: dict[str, Any] | None = None):
        self.queue, self.tag = queue, dict(tag or {})

    def tagged(self, **tag: Any) -> ProgressCallback:
        return ProgressCallback(self.queue, {**self.tag, **tag})

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if not metrics:
            return
        try:  # put_nowait returns once the queue holds it: every report is queued before fit() returns
            self.queue.put_nowait({**max(metrics, key=len), **self.tag, "reported_at": time.time()})
        except Exception:  # noqa: BLE001 - a lost queue (its node gone, the caller stopped) never fails the run
            return


class _Hub:
    """This process's progress queue on one Ray session, and a thread that routes its items to the open blocks while
    any is open (it ends with the last one: nothing polls Ray between fits or at shutdown)."""

    def __init__(self, session: tuple[str, str], poll_s: float):
        # on the caller's node: a worker node that leaves the cluster must not take the queue with it
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
        self.queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        self.session, self.poll_s = session, poll_s
        self.routes: dict[str, tuple[Callable[[dict[str, Any]], None], threading.Event]] = {}
        self.lock, self.alive, self.draining = threading.Lock(), True, False

    def _drain(self) -> None:
        while True:
            try:
                item = self.queue.get(timeout=self.poll_s)
            except Empty:
                with self.lock:
                    if not self.routes:
                        self.draining = False
                        return
                continue
            except Exception:  # noqa: BLE001 - Ray stopped under us (a cancel): nothing more will come
                break
            with self.lock:
                route = self.routes.get(item.pop(ROUTE, None))
            if route is None:  # a block that has ended already (waited out its flush): dropped
                continue
            deliver, ended = route
            if item.get(END):
                ended.set()
            else:
                deliver(item)
        with self.lock:
            self.alive = self.draining = False
            for _, ended in self.routes.values():
                ended.set()

    def open(self, deliver: Callable[[dict[str, Any]], None]) -> tuple[str, threading.Event]:
        route, ended = uuid.uuid4().hex, threading.Event()
        with self.lock:
            self.routes[route] = (deliver, ended)
            if not self.draining:
                self.draining = True
                threading.Thread(target=self._drain, name="trainflow-progress", daemon=True).start()
        return route, ended

    def close(self, route: str, ended: threading.Event, wait_s: float) -> None:
        """Pass what is still queued for route (everything before its end marker), then forget it."""
        try:
            self.queue.put_nowait({ROUTE: route, END: True})
            ended.wait(wait_s)
        except Exception:  # noqa: BLE001 - Ray stopped under us: what was queued is gone with it
            pass
        with self.lock:
            self.routes.pop(route, None)


_hub: _Hub | None = None
_hub_lock = threading.Lock()


def _current_hub(poll_s: float) -> _Hub:
    """The hub of this process's Ray session, made by its first fit that watches (a new one for a new ray.init: the
    job and the driver's node name the session)."""
    global _hub
    context = ray.get_runtime_context()
    session = (context.get_job_id(), context.get_node_id())
    with _hub_lock:
        if _hub is None or not _hub.alive or _hub.session != session:
            _hub = _Hub(session, poll_s)
        return _hub


@contextlib.contextmanager
def watch_progress(on_report: Callable[[dict[str, Any]], None], poll_s: float = 0.5,
                   flush_s: float = 30.0) -> Iterator[ProgressCallback]:
    """A ProgressCallback for the trainer's RunConfig; while the block runs (the fit), each report is passed to
    on_report on a helper thread, and the ones still queued when the block ends are passed before it returns (up to
    flush_s). A failing on_report is logged once and does not stop the fit."""
    failed = []

    def deliver(item: dict[str, Any]) -> None:
        try:
            on_report(item)
        except Exception as exc:  # noqa: BLE001 - progress must never fail training
            if not failed:
                log.warning("progress report failed (training goes on): %s", exc)
            failed.append(exc)

    hub = _current_hub(poll_s)
    route, ended = hub.open(deliver)
    try:
        yield ProgressCallback(hub.queue, {ROUTE: route})
    finally:
        hub.close(route, ended, flush_s)


class ProgressLine:
    """'mlp epoch 12/79: train_loss 0.4123, val_loss 0.4011, val_roc_auc 0.8123 (0.61 s/epoch)' per report."""

    def __init__(self, family: str, max_epochs: int | None, unit: str = "epoch"):
        self.family, self.max_epochs, self.unit = family, max_epochs, unit
        self.last: tuple[int, float] | None = None

    def __call__(self, metrics: dict[str, Any]) -> str:
        epoch, at = int(metrics.get("epoch", -1)), float(metrics.get("reported_at", time.time()))
        shown = ", ".join(f"{k} {float(metrics[k]):.4f}" for k in SHOWN if isinstance(metrics.get(k), (int, float)))
        pace = ""
        if isinstance(metrics.get("epoch_time_s"), (int, float)):
            pace = f" ({metrics['epoch_time_s']:.2f} s/{self.unit})"
        elif self.last is not None and epoch > self.last[0]:
            pace = f" ({(at - self.last[1]) / (epoch - self.last[0]):.2f} s/{self.unit})"
        self.last = (epoch, at)
        total = f"/{self.max_epochs}" if self.max_epochs else ""
        return f"{self.family} {self.unit} {epoch + 1}{total}: {shown}{pace}"
