"""Progress while a fit runs: Ray Train's controller hands each report's metrics to the process that called fit.

ProgressCallback runs on the controller (a UserCallback) and puts the reported metrics on a ray.util.queue.Queue;
watch_progress drains it on a thread of the calling process while fit() blocks, so the train task can print a
line per report and log the metrics to MLflow as they arrive instead of after the fit.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from queue import Empty
from typing import Any

import ray
from ray.train import UserCallback
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

log = logging.getLogger(__name__)
SHOWN = ("train_loss", "val_loss", "val_accuracy", "val_f1", "val_roc_auc", "val_rmse", "val_mae", "val_r2")


class ProgressCallback(UserCallback):
    """On Ray Train's controller: each report's metrics (the fullest worker's: a booster's rank 0) to the queue,
    with `tag` added (a tune trial's id and family, so one queue serves every trial of a sweep)."""

    def __init__(self, queue: Queue, tag: dict[str, Any] | None = None):
        self.queue, self.tag = queue, dict(tag or {})

    def tagged(self, **tag: Any) -> ProgressCallback:
        return ProgressCallback(self.queue, {**self.tag, **tag})

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if not metrics:
            return
        try:
            self.queue.put_nowait({**max(metrics, key=len), **self.tag, "reported_at": time.time()})
        except Exception:  # noqa: BLE001 - a lost queue (its node gone, the caller stopped) never fails the run
            return


@contextlib.contextmanager
def watch_progress(on_report: Callable[[dict[str, Any]], None], poll_s: float = 0.5) -> Iterator[ProgressCallback]:
    """A ProgressCallback for the trainer's RunConfig; while the block runs (the fit), each report is passed to
    on_report on a helper thread, and the ones still queued when the block ends are passed before it returns.
    A failing on_report is logged once and does not stop the fit."""
    # on the caller's node: a worker node that leaves the cluster must not take the queue with it
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
    done = threading.Event()
    failed = []

    def deliver(item: dict[str, Any]) -> None:
        try:
            on_report(item)
        except Exception as exc:  # noqa: BLE001 - progress must never fail training
            if not failed:
                log.warning("progress report failed (training goes on): %s", exc)
            failed.append(exc)

    def drain() -> None:
        while True:
            try:
                deliver(queue.get(timeout=poll_s))
            except Empty:
                if done.is_set():
                    return
            except Exception:  # noqa: BLE001 - Ray stopped under us (a cancel): nothing more will come
                return

    thread = threading.Thread(target=drain, name="trainflow-progress", daemon=True)
    thread.start()
    try:
        yield ProgressCallback(queue)
    finally:
        done.set()
        thread.join()
        with contextlib.suppress(Exception):
            queue.shutdown()


class ProgressLine:
    """'mlp epoch 12/79: train_loss 0.4123, val_loss 0.4011, val_roc_auc 0.8123 (0.61 s/epoch)' per report."""

    def __init__(self, family: str, max_epochs: int | None, unit: str = "epoch"):
        self.family, self.max_epochs, self.unit = family, max_epochs, unit
        self.last: tuple[int, float] | None = None
        self.workers: int | None = None

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
        workers = metrics.get("workers")
        resized = ""
        if isinstance(workers, (int, float)):
            if self.workers is not None and int(workers) != self.workers:
                resized = f" [{self.workers} -> {int(workers)} workers]"
            self.workers = int(workers)
        return f"{self.family} {self.unit} {epoch + 1}{total}: {shown}{pace}{resized}"
