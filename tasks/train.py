"""Task: run the distributed Ray Train fit and report every checkpoint it kept."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.tasks.common import retry_unless_user_error, lineage_for
from trainflow.tasks.mlflow_run import log_rows, open_run, tag_run
from trainflow.tasks.values import Prepared, TrainOutcome
from trainflow.trainer.checkpoint import METRICS_FILE, read_metrics
from trainflow.trainer.deadline import TIME_LIMITED
from trainflow.trainer.loop import STOP_REASON
from trainflow.trainer.progress import ProgressLine, watch_progress
from trainflow.trainer.recovery import (
    describe_resize,
    fold_events,
    read_events,
    recoveries,
    run_resizes,
    started_from,
)
from trainflow.trainer.session import FOLD, fold_folder
from trainflow.trainer.resources import check_fits
from trainflow.trainer.runner import (
    build_trainer,
    checkpoint_folders,
    checkpoints_on_disk,
    fit_run,
    folder_name,
    latest_epoch,
    latest_lineage,
    remove_unregistered,
    run_dir,
)
from trainflow.config import Config
from trainflow.errors import ConfigError, TrainingError
from trainflow.runtime import ensure_ray
from trainflow.services import ServiceUnavailable
from trainflow.storage import join, read_text, with_scheme, write_text

WORKER_GROUP_START_TIMEOUT = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
FINISHED_FILE = "trainflow_finished.json"  # a run that trained to its end: what it kept, for a rerun to reuse


@task(name="check-resume", cache_policy=NO_CACHE)
def check_resume(config: Config, fingerprint: str, runs: dict[str, str | list[str]]) -> None:
    """Before any training: a run name (family -> its run, or its fold runs) that already has checkpoints resumes
    only onto the same data and training config (ConfigError naming both fingerprints otherwise)."""
    pairs = [(f, r) for f, named in runs.items() for r in ([named] if isinstance(named, str) else named)]
    for family, run_name in pairs:
        path = run_dir(config.for_family(family), run_name)
        before = latest_lineage(path)
        if before is None:
            continue
        now = lineage_for(config, fingerprint, family)
        changed = [k for k in ("data_fingerprint", "config_hash") if before.get(k) != now[k]]
        if changed:
            what = " and ".join(
                {"data_fingerprint": "the data", "config_hash": "the training config"}[k] for k in changed
            )
            raise ConfigError(
                f"run {run_name} ({path}) exists and was trained on data {before.get('data_fingerprint')} with "
                f"{before.get('config_hash')}; this run has data {now['data_fingerprint']} with {now['config_hash']}: "
                f"{what} changed, so its checkpoints cannot be resumed. Start a new run with another --run-name "
                "(or restore the data and config that run used)"
            )


@task(name="train", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def train(prepared: Prepared, config: Config, run_name: str, family: str | None = None) -> TrainOutcome:
    """Fit one model family (default: the first of model.type) with its Ray Train trainer; a rerun with the
    same run_name resumes from its latest checkpoint; its workers stop at the deadline the caller wrote into the run's
    folder (trainer/deadline.py), with the best so far."""
    ensure_ray(**config.ray_start)
    check_fits(config.scaling.model_dump())  # again: a retry may find fewer nodes than ingest did
    log = get_run_logger()
    family = family or config.model.families[0]
    resolved = config.for_family(family)
    budget = prepared.budgets[family]
    path = run_dir(resolved, run_name)
    lineage = lineage_for(config, prepared.fingerprint, family)
    done = finished_outcome(path, lineage, budget.to_dict(), run_name, family)
    if done is not None:
        log.info(
            "run %s finished before on the same data, training config and budget: its %d checkpoint(s) are "
            "used, nothing is trained again",
            run_name,
            len(done.checkpoints),
        )
        return done
    mlflow_run = open_run(config, run_name, family)  # metrics arrive in MLflow while the fit runs
    progress, logged = ProgressLine(family, budget.limit, budget.unit), set()

    def on_report(metrics: dict[str, Any]) -> None:
        log.info(progress(metrics))
        log_rows(config.mlflow.tracking_uri, mlflow_run, [metrics])
        logged.add(int(metrics.get("epoch", -1)))

    log.info(
        "training %s (%s): %s worker(s)%s; %s; storage %s",
        run_name,
        family,
        config.scaling.workers_label,
        ", GPU" if config.scaling.use_gpu else "",
        budget.describe(),
        config.storage_path,
    )
    seen = len(read_events(path))
    existed = latest_epoch(path) is not None
    earlier = checkpoint_folders(path)
    if existed:
        log.info("run %s exists in %s: resuming from its latest checkpoint", run_name, config.storage_path)
    # read by Ray Train's controller and passed on from this process (Ray's own default is 60 s)
    os.environ[WORKER_GROUP_START_TIMEOUT] = f"{config.failure.worker_start_timeout_s:g}"
    started = time.monotonic()
    with watch_progress(on_report) as callback:
        trainer = build_trainer(
            resolved,
            prepared.preprocessor,
            prepared.train,
            prepared.val,
            run_name,
            cache_shards=prepared.materialized,
            streamed=not prepared.materialized,
            external_memory=budget.external_memory,
            lineage=lineage,
            callbacks=[callback],
        )
        result = fit_run(trainer, path, config.scaling.workers_label, config.data.materialize)
    if result.metrics and result.metrics.get(STOP_REASON):
        raise TrainingError(
            f"training stopped: {result.metrics[STOP_REASON]}; lower train.learning_rate or check the data"
        )
    checkpoints = []
    for ckpt, metrics in result.best_checkpoints or []:
        uri = with_scheme(config.storage_path, ckpt.path)  # Ray gives paths inside the storage filesystem
        checkpoints.append({"path": uri, "epoch": int(metrics.get("epoch", -1)), "metrics": dict(metrics)})
    history: list[dict[str, float]] = []
    if result.checkpoint is not None:
        with result.checkpoint.as_directory() as d:
            history = read_metrics(d)["history"]
    if not checkpoints:
        raise TrainingError(f"run {run_name} finished without reporting a checkpoint")
    held = {folder_name(c["path"]) for c in checkpoints}
    if result.checkpoint is not None:
        held.add(folder_name(result.checkpoint.path))
    remove_left_over(path, earlier, held, run_name)
    # the epochs the reports grouped away (and those before a resume), so MLflow holds every epoch
    log_rows(config.mlflow.tracking_uri, mlflow_run, [h for h in history if int(h.get("epoch", -1)) not in logged])
    events = read_events(path)
    final = history[-1] if history else {}
    unit = budget.unit
    log.info(
        "trained %d %s(s); the last: %s",
        len(history),
        unit,
        ", ".join(
            f"{k} {v:.4g}" for k, v in final.items() if k not in ("epoch", "epoch_time_s", "learning_rate", "workers")
        ),
    )
    resized = run_resizes(events)
    for r in resized:
        log.info("%s resized at %s", run_name, describe_resize(r))
    if resized:
        tag_run(config.mlflow.tracking_uri, mlflow_run, "trainflow.resizes", "; ".join(map(describe_resize, resized)))
    outcome = TrainOutcome(
        run_name=run_name,
        family=family,
        run_path=path,
        checkpoints=checkpoints,
        history=history,
        resumed_from_epoch=started_from(events[seen:]) if existed else None,
        recoveries=recoveries(events),
        resizes=resized,
        budget=budget.to_dict(),
        time_limited_at=time_limited(checkpoints),
        train_s=round(time.monotonic() - started, 1),
    )
    write_text(
        join(path, FINISHED_FILE),
        json.dumps({"lineage": lineage, "budget": budget.to_dict(), "outcome": asdict(outcome)}, default=str),
    )
    return outcome


def remove_left_over(path: str, earlier: set[str], held: set[str], run_name: str) -> None:
    """The checkpoint folders an earlier attempt of the run left in path and Ray Train does not hold, removed
    (runner.remove_unregistered) and said; a failure is said too: the model is trained, what is left waits for the
    next run of this name."""
    log = get_run_logger()
    try:
        removed = remove_unregistered(path, earlier, held)
    except (OSError, ServiceUnavailable) as exc:
        log.warning("could not remove the checkpoint folders an earlier attempt of %s left: %s", run_name, exc)
        return
    if removed:
        log.info(
            "removed %d checkpoint folder(s) that an earlier attempt of %s left and Ray Train does not hold: %s",
            len(removed),
            run_name,
            ", ".join(removed),
        )


def time_limited(checkpoints: list[dict[str, Any]]) -> int | None:
    """The epoch or round after which a run's time share ran out: its latest checkpoint's TIME_LIMITED (None: it
    trained to its end or early-stopped)."""
    if not checkpoints:
        return None
    value = max(checkpoints, key=lambda c: c["epoch"])["metrics"].get(TIME_LIMITED)
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def finished_outcome(
    path: str,
    lineage: dict[str, str],
    budget: dict[str, Any],
    run_name: str,
    family: str,
    events: list[dict[str, Any]] | None = None,
) -> TrainOutcome | None:
    """The outcome of a run that trained to its end before (FINISHED_FILE) on the same data and training config with
    the same budget; None: train (or resume). The record is a claim read from storage: only its lineage, budget and
    the checkpoint folders it names (each must still be there) are read from it. Everything else comes from the
    run's own folder: every readable checkpoint in it with the metrics stored inside it (a better one the record
    leaves out is still chosen), the history and the time limit from the latest checkpoint, recoveries from the
    run's event log (events: a fold's, from its run's log and its own); the run name, family and path are this
    call's."""
    try:
        record = json.loads(read_text(join(path, FINISHED_FILE)))
        if record["lineage"] != lineage or record["budget"] != json.loads(json.dumps(budget, default=str)):
            return None
        names = [folder_name(str(c["path"])) for c in record["outcome"]["checkpoints"]]
        train_s = record["outcome"].get("train_s")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, or not one trainflow wrote: train
        return None
    on_disk = checkpoints_on_disk(path)
    if not names or any(n not in {folder_name(c["path"]) for c in on_disk} for n in names):
        return None
    try:
        history = json.loads(read_text(join(on_disk[-1]["path"], METRICS_FILE)))["history"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        return None
    events = read_events(path) if events is None else events
    seconds = float(train_s) if isinstance(train_s, (int, float)) and math.isfinite(train_s) and train_s >= 0 else None
    return TrainOutcome(
        run_name=run_name,
        family=family,
        run_path=path,
        checkpoints=on_disk,
        history=history,
        recoveries=recoveries(events),
        resizes=run_resizes(events),
        budget=budget,
        time_limited_at=time_limited(on_disk),
        train_s=seconds,
    )


def fold_row(metrics: dict[str, Any]) -> dict[str, Any]:
    """A fold run's report or history row as MLflow metrics of its family's one run: fold<k>/<metric> at its epoch."""
    fold = metrics.get(FOLD)
    if not isinstance(fold, int):
        return metrics
    return {
        k if k in ("epoch", "reported_at") else f"{fold_folder(fold)}/{k}": v for k, v in metrics.items() if k != FOLD
    }


def _fold_outcome(
    fold: int,
    folder: str,
    name: str,
    family: str,
    checkpoints: list[dict[str, Any]],
    events: list[dict[str, Any]],
    budget: dict[str, Any],
    train_s: float,
) -> TrainOutcome:
    """One fold's outcome from what the run reported for it and its events (tagged with their folds)."""
    if not checkpoints:
        raise TrainingError(f"fold {fold} of run {name} finished without reporting a checkpoint")
    latest = max(checkpoints, key=lambda c: c["epoch"])
    history = json.loads(read_text(join(latest["path"], METRICS_FILE)))["history"]
    mine = [e for e in events if e.get(FOLD) == fold]
    return TrainOutcome(
        run_name=name,
        family=family,
        run_path=folder,
        checkpoints=checkpoints,
        history=history,
        resumed_from_epoch=started_from(mine),
        recoveries=[r for r in recoveries(events) if r.get(FOLD) == fold],
        budget=budget,
        time_limited_at=time_limited(checkpoints),
        train_s=train_s,
    )


@task(
    name="train-folds",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def train_folds(prepared: Prepared, config: Config, run_name: str, family: str, folds: list[int]) -> list[TrainOutcome]:
    """Fit a family's folds (cross-fitting) one after another inside one Ray Train run (trainer/session.py): Ray
    Train's start is paid once for all of them. Each fold keeps its checkpoints, events and finished record in its own
    folder of the run (<run>/fold<k>); a rerun with the same run_name trains no finished fold again and resumes the
    one it was in from that fold's latest checkpoint. One MLflow run holds every fold's metrics (fold<k>/val_loss).
    Returns the folds' outcomes in the order of folds, each named <run_name>-fold<k>."""
    ensure_ray(**config.ray_start)
    check_fits(config.scaling.model_dump())
    log = get_run_logger()
    resolved = config.for_family(family)
    budget = prepared.budgets[family]
    path = run_dir(resolved, run_name)
    lineage = lineage_for(config, prepared.fingerprint, family)
    folders = {k: join(path, fold_folder(k)) for k in folds}
    names = {k: f"{run_name}-{fold_folder(k)}" for k in folds}
    before = fold_events(path, folders)
    done = {
        k: finished_outcome(
            folders[k], lineage, budget.to_dict(), names[k], family, [e for e in before if e.get(FOLD) == k]
        )
        for k in folds
    }
    for k, outcome in done.items():
        if outcome is not None:  # the run's failures are paired with the resumes of every fold
            outcome.recoveries = [r for r in recoveries(before) if r.get(FOLD) == k]
    if all(done.values()):
        log.info(
            "run %s trained folds %s before on the same data, training config and budget: their checkpoints are "
            "used, nothing is trained again",
            run_name,
            ", ".join(map(str, folds)),
        )
        return [done[k] for k in folds]
    mlflow_run = open_run(config, run_name, family)
    progress, logged = ProgressLine(family, budget.limit, budget.unit, len(prepared.folds or [])), set()

    def on_report(metrics: dict[str, Any]) -> None:
        log.info(progress(metrics))
        log_rows(config.mlflow.tracking_uri, mlflow_run, [fold_row(metrics)])
        logged.add((metrics.get(FOLD), int(metrics.get("epoch", -1))))

    log.info(
        "training %s (%s), folds %s in one Ray Train run: %s worker(s)%s; %s each; storage %s",
        run_name,
        family,
        ", ".join(map(str, folds)),
        config.scaling.workers_label,
        ", GPU" if config.scaling.use_gpu else "",
        budget.describe(),
        config.storage_path,
    )
    seen = {d: len(read_events(d)) for d in [path, *folders.values()]}
    earlier = {k: checkpoint_folders(folders[k]) for k in folds}
    os.environ[WORKER_GROUP_START_TIMEOUT] = f"{config.failure.worker_start_timeout_s:g}"
    started = time.monotonic()
    with watch_progress(on_report) as callback:
        trainer = build_trainer(
            resolved,
            prepared.preprocessor,
            None,
            None,
            run_name,
            cache_shards=prepared.materialized,
            streamed=not prepared.materialized,
            external_memory=budget.external_memory,
            lineage=lineage,
            callbacks=[callback],
            folds={k: prepared.folds[k] for k in folds},
        )
        result = fit_run(trainer, path, config.scaling.workers_label, config.data.materialize)
    if result.metrics and result.metrics.get(STOP_REASON):
        raise TrainingError(
            f"training stopped: {result.metrics[STOP_REASON]}; lower train.learning_rate or check the data"
        )
    reported: dict[int, list[dict[str, Any]]] = {k: [] for k in folds}
    for ckpt, metrics in result.best_checkpoints or []:
        if metrics.get(FOLD) in reported:  # a restored run also holds the folds an earlier fit of it trained
            uri = with_scheme(config.storage_path, ckpt.path)
            reported[metrics[FOLD]].append(
                {"path": uri, "epoch": int(metrics.get("epoch", -1)), "metrics": dict(metrics)}
            )
    events = fold_events(path, folders, seen)
    train_s = round((time.monotonic() - started) / len(folds), 1)  # the folds' share of the run's wall time
    outcomes = []
    for k in folds:
        outcome = done[k] or _fold_outcome(
            k, folders[k], names[k], family, reported[k], events, budget.to_dict(), train_s
        )
        remove_left_over(folders[k], earlier[k], {folder_name(c["path"]) for c in outcome.checkpoints}, names[k])
        log_rows(
            config.mlflow.tracking_uri,
            mlflow_run,
            [fold_row({**h, FOLD: k}) for h in outcome.history if (k, int(h.get("epoch", -1))) not in logged],
        )
        outcomes.append(outcome)
        if done[k] is None:
            write_text(
                join(folders[k], FINISHED_FILE),
                json.dumps({"lineage": lineage, "budget": budget.to_dict(), "outcome": asdict(outcome)}, default=str),
            )
    resized = run_resizes(events)
    if resized:
        outcomes[0].resizes = resized
        tag_run(config.mlflow.tracking_uri, mlflow_run, "trainflow.resizes", "; ".join(map(describe_resize, resized)))
    log.info(
        "trained folds %s of %s: %s",
        ", ".join(map(str, folds)),
        run_name,
        "; ".join(f"fold {o.run_name.rsplit('fold', 1)[-1]}: {len(o.history)} {budget.unit}(s)" for o in outcomes),
    )
    return outcomes
