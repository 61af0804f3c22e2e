"""Build the family's Ray Train trainer from the config: scaling, checkpointing, failure handling, storage."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import ray
import ray.data
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.trainer.serving.checkpoint import LINEAGE_FILE, checkpoints_on_disk
from trainflow.trainer.families import family_for
from trainflow.trainer.deadline import fit_board
from trainflow.trainer.recovery import RESTART, AttemptLog, RecoveryLog, append_event, read_events
from trainflow.trainer import session
from trainflow.trainer.progress import watch_progress
from trainflow.trainer.session import FOLD_TRAIN_ROWS, FamiliesLoop, FoldLoop
from trainflow.trainer.shards import in_process_rows
from trainflow.trainer.watchdog import Watched
from trainflow.config import Config, FailureSection, ScalingSection
from trainflow.errors import ConfigError, TrainingError
from trainflow.trainer.memory import is_out_of_memory, out_of_memory_error
from trainflow.trainer.resources import check_fits
from trainflow.run.runtime import node_id, quiet_ray_loggers
from trainflow.run.storage import filesystem_for, join, list_dir, read_text

# the folder names Ray Train gives checkpoints (StorageContext.make_default_checkpoint_dir_name)
CHECKPOINT_DIR = re.compile(r"^checkpoint_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{6}$")


_LOCAL = threading.Lock()  # Ray Train's local mode keeps one train context per process: one local fit at a time


@contextlib.contextmanager
def fit_reports(run_path: str, on_report: Callable[[dict[str, Any]], None], local: bool) -> Iterator[list]:
    """While a fit of run_path runs, each report's metrics reach on_report in this process; yields the RunConfig
    callbacks the trainer takes. A fit through Ray Train: its controller's reports, through the progress queue
    (trainer/progress.py). A fit in local mode (local): reports write their checkpoints into the run's folder and
    call on_report in this thread, and a restart resumes from the run's latest checkpoint on disk
    (trainer/session.py); one local fit at a time in a process."""
    if not local:
        with watch_progress(on_report) as callback:
            yield [callback]
        return
    quiet_ray_loggers()  # Ray Train's local mode would log its start and every report's metrics at INFO
    with _LOCAL:
        # the attempt as AttemptLog records a worker group's: one worker, on this process's node
        append_event(
            run_path,
            {"event": "attempt", "workers": 1, "nodes": [n for n in [node_id()] if n], "local": True},
        )
        token = session._local.set((run_path, on_report))
        try:
            yield []
        finally:
            session._local.reset(token)


def local_checkpoints(
    folders: list[str], keep: int | None = None, metric: str = "val_loss", mode: str = "min"
) -> list[tuple[Any, dict]]:
    """What a Ray Train fit's result.best_checkpoints holds, for a fit in local mode: the complete checkpoints in
    each of folders (the run's, or its folds'), oldest first, each (Checkpoint, its metrics); with keep
    (checkpoint.num_to_keep, a run without folds) the best keep by metric and the latest, the others removed as Ray
    Train's checkpoint manager removes them."""
    from ray.train import Checkpoint

    from trainflow.trainer.serving.checkpoint import metric_value

    found = [c for folder in folders for c in checkpoints_on_disk(folder)]
    if keep is not None and len(found) > keep:
        worst = float("inf") if mode == "min" else float("-inf")

        def score(c: dict[str, Any]) -> float:
            value = metric_value(c["metrics"], metric)
            return worst if value is None else value

        ranked = sorted(found, key=score, reverse=mode != "min")
        held = {c["path"] for c in ranked[:keep]} | {found[-1]["path"]}
        for c in found:
            if c["path"] not in held:
                fs, inner = filesystem_for(c["path"])
                fs.delete_dir(inner)
        found = [c for c in found if c["path"] in held]
    checkpoints = []
    for c in found:
        fs, inner = filesystem_for(c["path"])
        checkpoints.append((Checkpoint(inner, filesystem=fs), c["metrics"]))
    return checkpoints


def local_result(result, folders: list[str], keep: int | None = None, metric: str = "val_loss", mode: str = "min"):
    """A local-mode fit's Result as Ray Train's would be: its best_checkpoints those local_checkpoints finds in folders
    (keeping `keep` as Ray's checkpoint manager would), its checkpoint the newest of them."""
    best = local_checkpoints(folders, keep, metric, mode)
    return dataclasses.replace(result, best_checkpoints=best, checkpoint=best[-1][0] if best else None)


def scaling_config(scaling: ScalingSection, local: bool = False) -> ScalingConfig:
    """ScalingConfig from the config's `scaling` section; local: Ray Train's local mode (num_workers 0)."""
    if local:
        return ScalingConfig(num_workers=0)
    return ScalingConfig(
        num_workers=(scaling.min_workers, scaling.max_workers) if scaling.elastic else scaling.num_workers,
        elastic_resize_monitor_interval_s=scaling.elastic_resize_monitor_interval_s,
        use_gpu=scaling.use_gpu,
        resources_per_worker=scaling.resources_per_worker,
        accelerator_type=scaling.accelerator_type,
        placement_strategy=scaling.placement_strategy,
    )


def failure_config(failure: FailureSection) -> FailureConfig:
    """Worker failures up to failure.max_failures; worker-group start-up failures bounded too (Ray's default is
    unlimited, so workers that die while starting would retry forever instead of reaching the Prefect retry); a
    drained node's restarts on their own budget (max_preemption_failures), with the survivors' grace period."""
    max_failures = failure.max_failures
    return FailureConfig(
        max_failures=max_failures,
        controller_failure_limit=-1 if max_failures < 0 else max_failures + 1,
        max_preemption_failures=failure.max_preemption_failures,
        preemption_grace_s=failure.preemption_grace_s,
    )


def run_dir(config: Config, run_name: str) -> str:
    """Where Ray Train keeps this run: checkpoints, its state, and trainflow's recovery log."""
    return join(config.storage_path, run_name)


def folder_name(path: str) -> str:
    """The last part of a checkpoint's path or URI (its folder's name inside the run)."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def checkpoint_folders(run_path: str) -> set[str]:
    """The names of the run's checkpoint folders, whatever their state (Ray Train's names only)."""
    return {name for name, is_dir in list_dir(run_path) if is_dir and CHECKPOINT_DIR.match(name)}


def remove_unregistered(run_path: str, earlier: set[str], registered: set[str]) -> list[str]:
    """Remove the checkpoint folders that earlier attempts of this run left (`earlier`: those there before this fit)
    and that Ray Train's controller does not hold after it (`registered`): one a worker was writing when its attempt
    died, or one Ray meant to delete when a better one replaced it. Ray deletes only what its controller holds, so
    nothing else would; a folder written during this fit is left alone. Returns the names removed."""
    fs, inner = filesystem_for(run_path)
    removed = []
    for name in sorted((earlier & checkpoint_folders(run_path)) - registered):
        fs.delete_dir(join(inner, name))
        removed.append(name)
    return removed


def latest_lineage(run_path: str) -> dict[str, str] | None:
    """The lineage.json of the run's latest readable checkpoint (None: a new run, or one written without it)."""
    found = checkpoints_on_disk(run_path)
    if not found:
        return None
    try:
        return json.loads(read_text(join(found[-1]["path"], LINEAGE_FILE)))
    except (OSError, ValueError):
        return None


def latest_epoch(run_path: str) -> int | None:
    """The highest epoch among the run's readable checkpoints, or None for a new run."""
    return max((c["epoch"] for c in checkpoints_on_disk(run_path)), default=None)


def build_trainer(
    config: Config,
    preprocessor: TabularPreprocessor,
    train_ds: ray.data.Dataset,
    val_ds: ray.data.Dataset,
    run_name: str,
    storage_filesystem=None,
    train_fn=None,
    callbacks: list | None = None,
    cache_shards: bool = False,
    streamed: bool = False,
    external_memory: bool = False,
    lineage: dict[str, str] | None = None,
    folds: dict[int, tuple[ray.data.Dataset, ray.data.Dataset]] | None = None,
    warm_start: dict[str, Any] | None = None,
    local: bool = False,
    fold_train_rows: dict[int, int] | None = None,
):
    """The model family's trainer (TorchTrainer, XGBoostTrainer, LightGBMTrainer); its run resumes when
    built again with the same storage_path and run_name.

    config: one family's (Config.for_family); train_fn replaces the family's per-worker loop (fault tests);
    cache_shards: torch workers keep their shard in memory after the first epoch (materialized data);
    streamed: the data is re-read from its files each epoch and each block's rows permuted on the workers;
    external_memory: XGBoost workers build external-memory matrices (trainer/families/xgboost_extmem.py);
    lineage: written into every checkpoint (data fingerprint, training config hash), checked by a resume;
    warm_start: the source model a fit with no checkpoint of its own continues (tasks/warm.py: its files, rounds);
    folds: {fold: (training rows, held-out rows)} trained one after another inside this one run (trainer/session.py),
    each into its own folder, instead of train_ds and val_ds. Ray Train ranks checkpoints across the whole run, so a
    fold run keeps every one it reports (its own num_to_keep would drop one fold's best for another's); the train
    task trims each fold to checkpoint.num_to_keep once every fold of the run has trained. local: in Ray Train's
    local mode (in_process; fit it inside fit_reports), with no hang watchdog (it would kill the caller's process);
    fold_train_rows: each fold's training rows, what its loop's budget counts (its steps per epoch, so the learning-rate
    schedule ends where its last epoch does), where not the preprocessor's.
    """
    family = family_for(config)
    config = config.for_family(family.name)  # its own model.params block resolved (a sweep's trial config too)
    loop = train_fn or family.train_fn
    datasets = {"train": train_ds, "val": val_ds}
    if folds is not None:
        loop = FoldLoop(loop)
        datasets = {f"{role}_{k}": ds for k, pair in folds.items() for role, ds in zip(("train", "val"), pair)}
    loop, datasets = in_process_rows(loop, datasets, local)
    return family.make_trainer(
        Watched(loop, None if local else config.failure.hang_timeout_s),
        config.scaling,
        train_loop_config={
            **_loop_config(config, preprocessor, run_name, cache_shards, streamed, lineage, local),
            "external_memory": external_memory,
            **({"folds": sorted(folds)} if folds is not None else {}),
            **({FOLD_TRAIN_ROWS: fold_train_rows} if fold_train_rows else {}),
            **({"warm_start": warm_start} if warm_start else {}),
        },
        scaling_config=scaling_config(family.worker_scaling(config.scaling), local),
        datasets=datasets,
        dataset_config=family.data_config(),
        run_config=_run_config(
            config, run_name, family.worker_scaling(config.scaling), folds is not None, storage_filesystem, callbacks
        ),
    )


def _loop_config(
    config: Config, preprocessor, run_name: str, cache_shards: bool, streamed: bool, lineage, local: bool
) -> dict[str, Any]:
    return {
        "config": config,
        "preprocessor": preprocessor.to_dict(),
        "run_dir": run_dir(config, run_name),
        "cache_shards": cache_shards,
        "streamed": streamed,
        "lineage": lineage,
        "deadline_board": fit_board(local),  # the driver's deadlines, as the fit can ask them (trainer/deadline.py)
    }


def _run_config(config: Config, run_name: str, scaling, folds: bool, storage_filesystem, callbacks) -> RunConfig:
    ckpt = config.checkpoint
    return RunConfig(
        name=run_name,
        storage_path=config.storage_path,
        storage_filesystem=storage_filesystem,
        checkpoint_config=CheckpointConfig(
            num_to_keep=None if folds else ckpt.num_to_keep,
            checkpoint_score_attribute=ckpt.metric,
            checkpoint_score_order=ckpt.mode,
        ),
        failure_config=failure_config(config.failure),
        callbacks=[
            RecoveryLog(run_dir(config, run_name), config),
            AttemptLog(run_dir(config, run_name), config, scaling),
            *(callbacks or []),
        ],
        worker_runtime_env={"env_vars": worker_env_to_pass(dict(config.scaling.env_vars))},
    )


def shared_scaling(configs: dict[str, Config]) -> ScalingSection | None:
    """The scaling of the one Ray Train run these families (their configs) can share (trainer/session.py
    FamiliesLoop): one CPU worker holding the most CPUs any of them asks for; None when they cannot share one (fewer
    than two, or one that is not a one-CPU-worker fixed-size fit)."""
    scalings = [family_for(config).worker_scaling(config.scaling) for config in configs.values()]
    if len(scalings) < 2 or any(s.elastic or s.num_workers != 1 or s.use_gpu for s in scalings):
        return None
    return max(scalings, key=lambda s: (s.resources_per_worker or {}).get("CPU", 1.0))


def run_scaling(configs: dict[str, Config], first: str | None = None) -> ScalingSection:
    """The worker group of one Ray Train run of these families (family -> its config): the one they share
    (shared_scaling), or the first's own (first: the family that trains first; default the first in configs)."""
    resolved = {f: c.for_family(family_for(c).name) for f, c in configs.items()}
    head = resolved[first or next(iter(resolved))]
    return shared_scaling(resolved) or family_for(head).worker_scaling(head.scaling)


def build_shared_trainer(
    configs: dict[str, Config],
    preprocessor: TabularPreprocessor,
    run_name: str,
    jobs: list[tuple[str, str, list[int], int]],
    folds: dict[int, tuple[ray.data.Dataset, ray.data.Dataset]],
    lineages: dict[str, dict[str, str]],
    callbacks: list | None = None,
    cache_shards: bool = False,
    auto_time: dict[str, float] | None = None,
    train_fns: dict[str, Any] | None = None,
    not_earning: dict[str, Any] | None = None,
    local: bool = False,
    fold_train_rows: dict[int, int] | None = None,
):
    """One Ray Train run in which every family of jobs ((family, its folder in the run, its folds, its folds a later
    fit of the run trains), in order) trains
    its folds one after another in one worker (trainer/session.py FamiliesLoop): the small table's retrain pays Ray
    Train's start once. configs: each family's (Config.for_family); the worker holds the most CPUs any of them asks
    for; auto_time: train.time_limit auto's {"started_at", "floor_s"} (FamiliesLoop); train_fns: a family's per-worker
    loop replaced (fault tests); not_earning: the not-earning rule the worker applies after every first fold
    (FamiliesLoop: {"first", "first_fold", "order", "base", "fold_rows", "k"}); local, fold_train_rows: as
    build_trainer's."""
    resolved = {f: c.for_family(family_for(c).name) for f, c in configs.items()}
    first = resolved[jobs[0][0]]
    widest = run_scaling(configs, jobs[0][0])
    loops = [(f, folder, (train_fns or {}).get(f) or family_for(resolved[f]).train_fn) for f, folder, _, _ in jobs]
    own = {
        folder: {
            "config": resolved[f],
            "folds": sorted(fs),
            "lineage": lineages[f],
            "external_memory": False,
            "folds_after": after,
        }
        for f, folder, fs, after in jobs
    }
    loop_config = {
        **_loop_config(first, preprocessor, run_name, cache_shards, not cache_shards, None, local),
        "jobs": own,
        "auto_time": auto_time,
        "not_earning": not_earning,
        **({FOLD_TRAIN_ROWS: fold_train_rows} if fold_train_rows else {}),
    }
    from trainflow.trainer.families.base import one_process_trainer, whole_data_config

    loop, datasets = in_process_rows(
        FamiliesLoop(loops),
        {f"{role}_{k}": ds for k, pair in folds.items() for role, ds in zip(("train", "val"), pair)},
        local,
    )
    return one_process_trainer(
        Watched(loop, None if local else first.failure.hang_timeout_s),
        widest,
        train_loop_config=loop_config,
        scaling_config=scaling_config(widest, local),
        datasets=datasets,
        dataset_config=whole_data_config(),
        run_config=_run_config(first, run_name, widest, True, None, callbacks),
    )


def worker_env_to_pass(wanted: dict[str, str]) -> dict[str, str]:
    """scaling.env_vars that the workers' runtime_env must still carry: those the local Ray this process started does
    not have in its processes' environment already (a runtime_env's values are written to Ray's agent log)."""
    from trainflow.run.runtime import carried_env

    carried = carried_env()
    return {k: v for k, v in wanted.items() if carried.get(k) != str(v)}


def stalled_error(last: str, count: int, num_workers: int | str, materialize: str) -> TrainingError:
    """A run whose workers stopped making progress: what ran out and what to change."""
    return TrainingError(
        f"training made no progress ({count} stalled worker(s) over its attempts); the last: {last}. A full "
        "object store or a starved Ray Data pipeline stalls workers without an error. Stream the table from its "
        f"files (data.materialize: never; now {materialize}), use fewer workers (scaling.num_workers: {num_workers}), "
        "or give Ray a larger object store (ray start --object-store-memory) or more memory; "
        "failure.hang_timeout_s sets how long a worker may go without progress"
    )


def fit_run(trainer, run_path: str, num_workers: int | str, materialize: str = "auto"):
    """trainer.fit(), with the failures a retry cannot fix turned into TrainingErrors that say what to change:
    a worker killed for memory, and a run whose every attempt stalled (the hang watchdog's events)."""
    seen = len(read_events(run_path))
    try:
        return trainer.fit()
    except Exception as exc:
        if is_out_of_memory(exc):  # Ray's memory monitor killed a worker: a retry would only be killed again
            raise out_of_memory_error("training", num_workers) from None
        hangs = [e for e in read_events(run_path)[seen:] if e.get("event") == "hang"]
        if hangs:  # every attempt Ray Train made stalled: a retry would stall the same way
            raise stalled_error(hangs[-1]["error"], len(hangs), num_workers, materialize) from None
        text = str(exc)
        if RESTART in text:  # AttemptLog refused a fixed-size restart the cluster cannot hold any more
            raise restart_refused(text) from None
        raise


def restart_refused(text: str) -> ConfigError:
    """The error for a fixed-size run whose restart the cluster cannot hold any more: check_fits's line (from the
    RESTART subject on) and what the user can do."""
    said = text[text.index(RESTART) :].splitlines()[0]
    return ConfigError(
        f"{said} The run is resumable: rerun it under its name once the cluster holds it, or make it "
        "elastic (scaling.num_workers: [min, max]) to go on with fewer workers."
    )


def check_attempt_fits(scaling: ScalingSection, retry: bool) -> None:
    """check_fits before a train task's attempt: a retry (the task's run after a failed one, e.g. the fit raised
    when a node was lost) that no longer fits is refused as AttemptLog refuses Ray Train's own restart, with the
    same words, so which of the two sees the lost node first does not change what the user reads."""
    if not retry:
        check_fits(scaling.model_dump())
        return
    try:
        check_fits(scaling.model_dump(), what=RESTART)
    except ConfigError as exc:
        raise (ConfigError(str(exc)) if scaling.elastic else restart_refused(str(exc))) from None
