"""One report-and-resume policy for every family's training loop: the torch loop's epochs and the boosters' rounds.

A step (an epoch or a boosting round) is reported to Ray Train, with a checkpoint, when it is the last one or when
checkpoint.min_interval_s has passed since the previous report; at each report the best step since the previous one is
reported first with its own checkpoint, so grouping steps never loses the best model. A worker that starts from a
checkpoint records a resume event, and every worker records where it started (the run's recovery log).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import ray

from trainflow.trainer import session
from trainflow.trainer.deadline import Deadline
from trainflow.trainer.recovery import append_event


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


def record_start(loop_config: dict[str, Any], rank: int, start: int, resumed: bool, **extra: Any) -> None:
    """The recovery log's events for a worker's start: a resume (rank 0, when a checkpoint was loaded) and which
    node each rank runs on per attempt (where a run spread, and where it restarted after a failure). Rank 0 also
    removes the local copies an earlier attempt of the run left on this node unuploaded (its group is gone)."""
    run_dir = loop_config.get("run_dir")
    if not run_dir:
        return
    if rank == 0:
        clean_local_checkpoints(run_dir)
    if resumed and rank == 0:
        append_event(run_dir, {"event": "resume", "epoch": start})
    append_event(
        run_dir,
        {
            "event": "worker_start",
            "rank": rank,
            "node_id": ray.get_runtime_context().get_node_id(),
            "from_epoch": start,
            **extra,
        },
    )


def rank_zero_deadline(loop_config: dict[str, Any], rank: int) -> Callable[[float], bool] | None:
    """Rank 0's view of the run's deadline (the other ranks follow its decision); None on the other ranks."""
    run_dir, board = loop_config.get("deadline_dir") or loop_config.get("run_dir"), loop_config.get("deadline_board")
    if rank != 0 or not run_dir or board is None:
        return None
    return Deadline(board, run_dir, share=loop_config.get("folds_left", 1)).passed


def record_time_limit(loop_config: dict[str, Any], step: int, unit: str) -> None:
    """Rank 0: the run stops because its time share was spent (its last report carries TIME_LIMITED)."""
    print(
        f"trainflow time limit: the run's share of train.time_limit is spent; stopping after {unit} {step} with the "
        "best so far"
    )


def async_upload(upload: str, storage_path: str) -> bool:
    """checkpoint.upload: whether a checkpoint goes to storage while training goes on (auto: where it is remote)."""
    from trainflow.storage import is_uri

    return upload == "async" or (upload == "auto" and is_uri(storage_path))


def local_checkpoint_prefix(run_dir: str) -> str:
    """The prefix of the local folders a run's asynchronous reports are written into (one run's, by its run folder)."""
    return f"trainflow-checkpoint-{hashlib.blake2b(run_dir.encode(), digest_size=6).hexdigest()}-"


def clean_local_checkpoints(run_dir: str) -> list[str]:
    """Remove this run's local checkpoint copies on this node: those an attempt wrote and Ray never uploaded (the
    store went away, the worker died), which nothing else removes. Called as an attempt starts, when no upload of
    the run is in flight. Returns what was removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(local_checkpoint_prefix(run_dir) + "*"):
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    return removed


def report_step(
    metrics: dict[str, Any], rank: int, write: Callable[[str], None], config: Any, run_dir: str = ""
) -> None:
    """One Ray Train report, with the checkpoint rank 0 writes into a folder (write(folder)). Synchronous: Ray
    uploads the folder before the report returns. Asynchronous (checkpoint.upload): training goes on while Ray
    uploads it, the local copy is removed after, and the report (so the checkpoint Ray registers, ranks and lets a
    resume or the selection read) reaches the controller only once the upload is whole; a failed upload fails the
    worker group (Ray restarts it from the last registered checkpoint)."""
    from ray.train import Checkpoint, CheckpointUploadMode

    if not async_upload(config.checkpoint.upload, config.storage_path):
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                write(tmp)
                checkpoint = Checkpoint.from_directory(tmp)
            session.report(metrics, checkpoint=checkpoint)
        return
    checkpoint = None
    if rank == 0:
        folder = tempfile.mkdtemp(prefix=local_checkpoint_prefix(run_dir))  # Ray removes it once uploaded
        try:
            write(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        checkpoint = Checkpoint.from_directory(folder)
    session.report(
        metrics,
        checkpoint=checkpoint,
        checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        delete_local_checkpoint_after_upload=True,
    )
