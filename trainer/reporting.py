"""What every family's training loop does around its steps (trainer/steps.py decides when): one Ray Train report with
its checkpoint, uploaded synchronously or while training goes on (checkpoint.upload); a worker that starts from a
checkpoint records a resume event, and every worker records where it started (the run's recovery log).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from trainflow.run.runtime import node_id

from trainflow.trainer import session
from trainflow.trainer.recovery import append_event


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
            "node_id": node_id(),
            "from_epoch": start,
            **extra,
        },
    )


def async_upload(upload: str, storage_path: str) -> bool:
    """checkpoint.upload: whether a checkpoint goes to storage while training goes on (auto: where it is remote)."""
    from trainflow.run.storage import is_uri

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
