"""Progress while a fit runs: Ray Train's controller hands each report's metrics to the process that called fit.

ProgressCallback runs on the controller (a UserCallback) and puts the reported metrics on a ray.util.queue.Queue
(one per process and Ray session); watch_progress receives them on a thread of the calling process while fit()
blocks, so the train task can print a line per report and log the metrics to MLflow as they arrive instead of after
the fit.
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


class ProgressCallback(UserCallback):
    """On Ray Train's controller: each report's metrics (the fullest worker's: a booster's rank 0) to the queue,
    with `tag` added (the watch it belongs to; a tune trial's id and family)."""

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


WATCH = "_trainflow_watch"  # the tag that routes a report to the watch_progress block it belongs to
FIRST_PAUSE_S = 0.05  # the drain's first wait after a report; it grows to watch_progress's poll_s while none comes


class _Channel:
    """One progress queue per process and Ray session, shared by every fit the process watches (a retrain's
    families, folds and backtest fits, a sweep's trials): a queue is an actor, and a new actor is a new worker
    process (about a second to start and 1-2 s of CPU), once instead of once per fit. While at least one fit is
    watched, one thread hands each report to the watch its tag names, in the order the controller put them; with
    none it stops (a thread blocked on Ray when Ray shuts down, as a process exits, crashes it)."""

    def __init__(self, key: tuple[str, str], poll_s: float):
        # on the caller's node: a worker node that leaves the cluster must not take the queue with it
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        self.key, self.poll_s = key, poll_s
        self.queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        self.watches: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.lock = threading.Lock()  # held while an item is taken and handed on: a flush sees every earlier one
        self.guard = threading.Lock()  # the watches and the thread: started with the first, stopped after the last
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.broken = False  # the queue's actor died (its node left): the next fit starts a new channel

    def open(self, watch: str, deliver: Callable[[dict[str, Any]], None]) -> None:
        with self.guard:
            self.watches[watch] = deliver
            if self.thread is None or not self.thread.is_alive():
                self.stop = threading.Event()
                self.thread = threading.Thread(
                    target=self._drain, args=(self.stop,), name="trainflow-progress", daemon=True
                )
                self.thread.start()

    def close(self, watch: str) -> None:
        """Every report queued so far handed on (the fit returned: each of its reports was put before), then the
        watch forgotten; the thread stops with the last watch."""
        self.flush()
        with self.guard:
            self.watches.pop(watch, None)
            ending = self.thread if not self.watches else None
            if ending is not None:
                self.stop.set()
                self.thread = None
        if ending is not None:
            ending.join()

    def _hand_on(self, item: dict[str, Any]) -> None:
        deliver = self.watches.get(item.pop(WATCH, None))
        if deliver is not None:  # else the watch ended (a report of a fit abandoned before its end)
            deliver(item)

    def _drain(self, stop: threading.Event) -> None:
        pause = FIRST_PAUSE_S
        while not stop.is_set():
            with self.lock:
                try:  # untimed: ray.util.queue's timed get (asyncio.wait_for on Python 3.11) can lose an item
                    item = self.queue.get_nowait()
                except Empty:
                    item = None
                except Exception:  # noqa: BLE001 - Ray stopped under us (a cancel) or the queue died: nothing more comes
                    self.broken = True
                    return
                if item is not None:
                    self._hand_on(item)
            # reports come in bursts (an epoch's, a fold's end): the next ask comes at once after an item, then
            # later and later while none comes, up to poll_s (each ask is an actor call: at a fixed 0.05 s the
            # asking took about a tenth of a core, the caller's and the queue's, while a fit ran)
            if item is not None:
                pause = FIRST_PAUSE_S
                time.sleep(0)  # a flush waiting for the lock gets it
            else:
                stop.wait(pause)  # a close ends the wait at once
                pause = min(self.poll_s, pause * 1.5)

    def flush(self) -> None:
        with self.lock:
            with contextlib.suppress(Exception):  # Ray gone: nothing more to hand on
                while not self.queue.empty():
                    self._hand_on(self.queue.get_nowait())

    def alive(self) -> bool:
        return self.key == _session() and not self.broken


def _session() -> tuple[str, str]:
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_job_id()


_CHANNEL: list[_Channel] = []
_CHANNEL_LOCK = threading.Lock()


def _channel(poll_s: float) -> _Channel:
    with _CHANNEL_LOCK:
        if not _CHANNEL or not _CHANNEL[0].alive():  # the first fit, or Ray started again since
            _CHANNEL[:] = [_Channel(_session(), poll_s)]
        return _CHANNEL[0]


@contextlib.contextmanager
def watch_progress(on_report: Callable[[dict[str, Any]], None], poll_s: float = 0.5) -> Iterator[ProgressCallback]:
    """A ProgressCallback for the trainer's RunConfig; while the block runs (the fit), each report is passed to
    on_report on a helper thread, and the ones still queued when the block ends are passed before it returns.
    A failing on_report is logged once and does not stop the fit."""
    failed = []

    def deliver(item: dict[str, Any]) -> None:
        try:
            on_report(item)
        except Exception as exc:  # noqa: BLE001 - progress must never fail training
            if not failed:
                log.warning("progress report failed (training goes on): %s", exc)
            failed.append(exc)

    channel, watch = _channel(poll_s), uuid.uuid4().hex
    channel.open(watch, deliver)
    try:
        yield ProgressCallback(channel.queue, {WATCH: watch})
    finally:
        channel.close(watch)


class ProgressLine:
    """'mlp epoch 12/79: train_loss 0.4123, val_loss 0.4011, val_roc_auc 0.8123 (0.61 s/epoch)' per report; a fold
    run's reports name their fold ('mlp fold 2/5 epoch 12/79: ...')."""

    def __init__(self, family: str, max_epochs: int | None, unit: str = "epoch", folds: int | None = None):
        self.family, self.max_epochs, self.unit, self.folds = family, max_epochs, unit, folds
        self.last: tuple[int, float] | None = None
        self.workers: int | None = None
        self.fold: int | None = None

    def __call__(self, metrics: dict[str, Any]) -> str:
        epoch, at = int(metrics.get("epoch", -1)), float(metrics.get("reported_at", time.time()))
        name = self.family
        if isinstance(metrics.get("fold"), int):
            if metrics["fold"] != self.fold:  # a new fold counts its epochs from 0 again
                self.fold, self.last = metrics["fold"], None
            name = f"{self.family} fold {self.fold + 1}" + (f"/{self.folds}" if self.folds else "")
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
        return f"{name} {self.unit} {epoch + 1}{total}: {shown}{pace}{resized}"
