"""Task: run the distributed Ray Train fit and report every checkpoint it kept."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict
from typing import Any, Callable

from prefect import get_run_logger, task
from prefect.runtime import task_run
from prefect.cache_policies import NO_CACHE
from pyarrow.fs import FileType

from trainflow.tasks.common import retry_unless_user_error, lineage_for
from trainflow.tasks.mlflow_run import log_rows, open_run, tag_run
from trainflow.tasks.values import Prepared, TrainOutcome
from trainflow.trainer.serving.checkpoint import METRICS_FILE, read_metrics
from trainflow.trainer.deadline import TIME_LIMITED
from trainflow.trainer.steps import STOP_REASON
from trainflow.trainer.progress import ProgressLine
from trainflow.trainer.recovery import (
    describe_resize,
    fold_events,
    read_events,
    recoveries,
    run_resizes,
    started_from,
)
from trainflow.run.redact import redact_text
from trainflow.trainer.session import FAILED_FILE, FAMILY, FOLD, LEFT_OUT_FILE, fold_folder
from trainflow.trainer.runner import (
    check_attempt_fits,
    build_shared_trainer,
    build_trainer,
    checkpoint_folders,
    checkpoints_on_disk,
    fit_run,
    fit_reports,
    folder_name,
    local_checkpoints,
    local_result,
    latest_epoch,
    latest_lineage,
    remove_unregistered,
    run_dir,
    run_scaling,
)
from trainflow.config import Config
from trainflow.errors import ConfigError, TrainingError
from trainflow.run.runtime import ensure_ray, in_process
from trainflow.run.services import ServiceUnavailable
from trainflow.run.storage import filesystem_for, join, read_text, with_scheme, write_text

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


# the training tasks' retries (the flow sets failure.task_retries and retry_delay_s per run)
RETRIED = {
    "retries": 2,
    "retry_delay_seconds": 5,
    "retry_condition_fn": retry_unless_user_error,
    "cache_policy": NO_CACHE,
}


@task(name="train", **RETRIED)
def train(prepared: Prepared, config: Config, run_name: str, family: str | None = None) -> TrainOutcome:
    """Fit one model family (default: the first of model.type) with its Ray Train trainer; a rerun with the
    same run_name resumes from its latest checkpoint; its workers stop at the deadline the caller wrote into the run's
    folder (trainer/deadline.py), with the best so far."""
    check_attempt_fits(config.scaling, task_run.run_count > 1)  # again: a retry may find fewer nodes than ingest did
    log = get_run_logger()
    family = family or config.model.families[0]
    resolved = config.for_family(family)
    local = in_process(config, run_scaling({family: resolved}), prepared.rows, prepared.materialized)
    if not local:  # a fit in this process (Ray Train's local mode) of rows it holds needs no Ray
        ensure_ray(**config.ray_start)
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

    seen, existed, earlier = _starting(config, path, run_name, family, budget)
    # read by Ray Train's controller and passed on from this process (Ray's own default is 60 s)
    os.environ[WORKER_GROUP_START_TIMEOUT] = f"{config.failure.worker_start_timeout_s:g}"
    started = time.monotonic()
    with fit_reports(path, on_report, local) as callbacks:
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
            callbacks=callbacks,
            warm_start=prepared.warm_start_for(family),
            local=local,
        )
        result = fit_run(trainer, path, config.scaling.workers_label, config.data.materialize)
    check_not_stopped(result)
    if local:
        keep = resolved.checkpoint
        result = local_result(result, [path], keep.num_to_keep, keep.metric, keep.mode)
    checkpoints, history, held = _kept(result, config.storage_path, run_name)
    remove_left_over(path, earlier, held, run_name)
    # the epochs the reports grouped away (and those before a resume), so MLflow holds every epoch
    log_rows(config.mlflow.tracking_uri, mlflow_run, [h for h in history if int(h.get("epoch", -1)) not in logged])
    events = read_events(path)
    resized = _said_trained(config, mlflow_run, run_name, budget.unit, history, events)
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


def _starting(config: Config, path: str, run_name: str, family: str, budget: Any) -> tuple[int, bool, set[str]]:
    """A fit about to start, said in the task's log (resuming, when its run has a checkpoint): what the run held
    before it (its events, whether it has a checkpoint, its checkpoint folders)."""
    log = get_run_logger()
    log.info(
        "training %s (%s): %s worker(s)%s; %s; storage %s",
        run_name,
        family,
        config.scaling.workers_label,
        ", GPU" if config.scaling.use_gpu else "",
        budget.describe(),
        config.storage_path,
    )
    existed = latest_epoch(path) is not None
    if existed:
        log.info("run %s exists in %s: resuming from its latest checkpoint", run_name, config.storage_path)
    return len(read_events(path)), existed, checkpoint_folders(path)


LOWER_THE_RATE = "lower the network's learning rate (model.params.mlp.learning_rate, ...) or check the data"


def check_not_stopped(result) -> None:
    """TrainingError when a fit stopped itself (its loss diverged: the loop's STOP_REASON), saying what to change."""
    if result.metrics and result.metrics.get(STOP_REASON):
        raise TrainingError(f"training stopped: {result.metrics[STOP_REASON]}; {LOWER_THE_RATE}")


def _kept(result, storage_path: str, run_name: str) -> tuple[list[dict[str, Any]], list[dict[str, float]], set[str]]:
    """What a fit's result holds: its checkpoints as records (URI, epoch, metrics), the history of its latest, and
    the folder names it holds (those and the latest's); TrainingError when it reported none."""
    checkpoints = []
    for ckpt, metrics in result.best_checkpoints or []:
        uri = with_scheme(storage_path, ckpt.path)  # Ray gives paths inside the storage filesystem
        checkpoints.append({"path": uri, "epoch": int(metrics.get("epoch", -1)), "metrics": dict(metrics)})
    if not checkpoints:
        raise TrainingError(f"run {run_name} finished without reporting a checkpoint")
    held = {folder_name(c["path"]) for c in checkpoints}
    history: list[dict[str, float]] = []
    if result.checkpoint is not None:
        with result.checkpoint.as_directory() as d:
            history = read_metrics(d)["history"]
        held.add(folder_name(result.checkpoint.path))
    return checkpoints, history, held


def _said_trained(
    config: Config, mlflow_run: Any, run_name: str, unit: str, history: list[dict[str, float]], events: list[dict]
) -> list[dict[str, Any]]:
    """The run's last figures and its resizes in the task's log (the resizes tagged on its MLflow run); the resizes."""
    log = get_run_logger()
    final = history[-1] if history else {}
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
    return resized


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


def one_split_row(metrics: dict[str, Any]) -> dict[str, Any]:
    """A one-split family's report or history row from a shared run as its MLflow run's metrics: as its own run's."""
    return {k: v for k, v in metrics.items() if k not in (FOLD, FAMILY)}


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
    """One fold's outcome from what the run reported for it and its events (tagged with their folds, and in a run
    several families share with their families)."""
    if not checkpoints:
        raise TrainingError(f"fold {fold} of run {name} finished without reporting a checkpoint")
    latest = max(checkpoints, key=lambda c: c["epoch"])
    history = json.loads(read_text(join(latest["path"], METRICS_FILE)))["history"]
    mine = [e for e in events if e.get(FOLD) == fold and e.get(FAMILY, family) == family]
    return TrainOutcome(
        run_name=name,
        family=family,
        run_path=folder,
        checkpoints=checkpoints,
        history=history,
        resumed_from_epoch=started_from(mine),
        recoveries=[r for r in recoveries(events) if r.get(FOLD) == fold and r.get(FAMILY, family) == family],
        budget=budget,
        time_limited_at=time_limited(checkpoints),
        train_s=train_s,
    )


@task(name="train-folds", **RETRIED)
def train_folds(prepared: Prepared, config: Config, run_name: str, family: str, folds: list[int]) -> list[TrainOutcome]:
    """Fit a family's folds (cross-fitting) one after another inside one Ray Train run (trainer/session.py): Ray
    Train's start is paid once for all of them. Each fold keeps its checkpoints, events and finished record in its own
    folder of the run (<run>/fold<k>); a rerun with the same run_name trains no finished fold again and resumes the
    one it was in from that fold's latest checkpoint. One MLflow run holds every fold's metrics (fold<k>/val_loss).
    Returns the folds' outcomes in the order of folds, each named <run_name>-fold<k>."""
    return train_shared.fn(prepared, config, run_name, [(family, run_name, folds, 0)])[0][family]


SHARED_SUFFIX = "-families"  # <run name>-families: the Ray Train run a small table's families share


def shared_run_name(runs: dict[str, str]) -> str | None:
    """The Ray Train run every family trains in (<name>-families, their runs <name>-families/<run>), or None."""
    heads = {r.split("/", 1)[0] if "/" in r else None for r in runs.values()}
    head = heads.pop() if len(heads) == 1 else None
    return head if head and head.endswith(SHARED_SUFFIX) else None


@task(name="train-shared", **RETRIED)
def train_shared(
    prepared: Prepared,
    config: Config,
    run_name: str,
    jobs: list[tuple[str, str, list[int], int]],
    auto_time: dict[str, float] | None = None,
    not_earning: dict[str, Any] | None = None,
    configs: dict[str, Config] | None = None,
) -> tuple[dict[str, list[TrainOutcome]], dict[str, str], dict[str, str]]:
    """A small table's families trained in one Ray Train run run_name, one after another in one worker
    (trainer/session.py FamiliesLoop): jobs are (family, its run <run_name>/<family run>, its folds, its folds a
    later fit of the run trains); auto_time: train.time_limit auto's rule (FamiliesLoop); not_earning: the rule the
    worker applies once every family's first fold trained (FamiliesLoop); configs: a family's own config where it
    is not config.for_family(family) (a refit's: its rounds fixed, flows/refit.py). Each family keeps its folders, MLflow run and finished records as train_folds gives them; a rerun resumes the family and fold
    it was in. Returns ({family: its folds' outcomes}, {family: why it failed}, {family: why the not-earning rule
    left out its other folds}): a family whose code raised, or whose loss diverged, is left out and the others are
    kept; one the rule left out has its first fold's outcome only. One job whose run is run_name itself is train_folds' one
    family, trained as its own run (its code's error fails the task)."""
    check_attempt_fits(config.scaling, task_run.run_count > 1)
    log = get_run_logger()
    shared = not (len(jobs) == 1 and jobs[0][1] == run_name)
    one_split = not prepared.folds  # its families' fold 0: run names, MLflow rows and progress lines name no fold
    path = run_dir(config, run_name)
    fams = _shared_jobs(prepared, config, jobs, one_split, configs or {})
    keyed = {((f, k) if shared else k): d for f, j in fams.items() for k, d in j["folders"].items()}
    done = _finished_before(path, fams, keyed)
    if all(done.values()):
        log.info(
            "run %s trained %s before on the same data, training config and budget: their checkpoints are used, "
            "nothing is trained again",
            run_name,
            "; ".join(f"{f} folds {', '.join(map(str, j['folds']))}" for f, j in fams.items()),
        )
        return {f: [done[(f, k)] for k in j["folds"]] for f, j in fams.items()}, {}, {}
    # a shared run's families that finished every fold before (a rerun) are not in this fit
    todo = {f: j for f, j in fams.items() if not all(done[(f, k)] for k in j["folds"])}
    for f, j in todo.items():
        j["mlflow"] = open_run(j["config"], j["run"], f)
        j["progress"] = ProgressLine(f, j["budget"].limit, j["budget"].unit, 0 if one_split else len(prepared.folds))
    logged: set[tuple[str, Any, int]] = set()
    only = next(iter(todo))
    row = one_split_row if one_split else fold_row  # one split's family run holds plain metrics

    def on_report(metrics: dict[str, Any]) -> None:
        f = metrics.get(FAMILY, only)
        if f not in todo:
            return
        log.info(fams[f]["progress"](row(metrics) if one_split else metrics))
        log_rows(config.mlflow.tracking_uri, fams[f]["mlflow"], [row(metrics)])
        logged.add((f, metrics.get(FOLD), int(metrics.get("epoch", -1))))

    seen = {d: len(read_events(d)) for d in [path, *keyed.values()]}
    earlier = {key: checkpoint_folders(d) for key, d in keyed.items()}
    started = time.monotonic()
    best = _fit_shared(prepared, config, run_name, fams, todo, shared, on_report, auto_time, not_earning)
    reported: dict[tuple[str, int], list[dict[str, Any]]] = {(f, k): [] for f, j in fams.items() for k in j["folds"]}
    for (f, k), (ckpt, metrics) in best:
        key = (f or only, k)
        if key in reported:  # a restored run also holds the folds an earlier fit of it trained
            uri = with_scheme(config.storage_path, ckpt.path)
            reported[key].append({"path": uri, "epoch": int(metrics.get("epoch", -1)), "metrics": dict(metrics)})
    events = fold_events(path, keyed, seen)
    train_s = round((time.monotonic() - started) / len(reported), 1)  # the folds' share of the run's wall time
    outcomes: dict[str, list[TrainOutcome]] = {}
    failed: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for f, j in fams.items():
        why = _left_out_in_shared_run(f, j, reported, done) if shared and f in todo else None
        if why:  # the not-earning rule: its first fold trained, its others did not
            left_out[f] = why
            j["folds"] = j["folds"][:1]
        why = _failed_in_shared_run(f, j, reported) if shared and f in todo else None
        if why:
            failed[f] = why
            log.warning("%s failed in the shared run %s, the other families are kept: %s", f, run_name, why)
            continue
        outcomes[f] = _finish_folds(config, f, j, done, reported, events, train_s, earlier, shared, logged, row)
    return outcomes, failed, left_out


def fold_train_rows(prepared: Prepared) -> dict[int, int] | None:
    """Cross-fitted: each fold's training rows (the non-test rows less its own), what its loop counts its steps by;
    None on one split (the preprocessor's count is the training role's; a backtest's one split keeps the plan's
    fold_rows, its folds None)."""
    if not prepared.folds:
        return None
    return {k: prepared.rows - held for k, held in enumerate(prepared.fold_rows)}


def _shared_jobs(
    prepared: Prepared,
    config: Config,
    jobs: list[tuple[str, str, list[int], int]],
    one_split: bool,
    configs: dict[str, Config],
) -> dict[str, dict[str, Any]]:
    """Each job of train_shared as the record its helpers share: its config (configs' or config's), run, home
    folder, folds and their folders and run names, budget and lineage."""
    fams: dict[str, dict[str, Any]] = {}
    for family, family_run, folds, after in jobs:
        mine = configs.get(family) or config.for_family(family)
        home = run_dir(mine, family_run)
        fams[family] = {
            "config": mine,
            "run": family_run,
            "home": home,
            "folds": list(folds),
            "after": after,
            "budget": prepared.budgets[family],
            # (the run config's hash, as a family's run always had it; a refit's own config where it has one)
            "lineage": lineage_for(configs.get(family) or config, prepared.fingerprint, family),
            "folders": {k: join(home, fold_folder(k)) for k in folds},
            # one split (its fold 0 of a shared run): the family's run name, as a run of its own has
            "names": {k: family_run if one_split else f"{family_run}-{fold_folder(k)}" for k in folds},
        }
    return fams


def _finished_before(
    path: str, fams: dict[str, dict[str, Any]], keyed: dict[Any, str]
) -> dict[tuple[str, int], TrainOutcome | None]:
    """Each (family, fold)'s outcome where an earlier fit of the run finished it on the same data, config and budget
    (with the run's recoveries of that fold), else None."""
    before = fold_events(path, keyed)
    done: dict[tuple[str, int], TrainOutcome | None] = {}
    for f, j in fams.items():
        for k in j["folds"]:
            mine = [e for e in before if e.get(FOLD) in (None, k) and e.get(FAMILY, f) == f]
            outcome = finished_outcome(j["folders"][k], j["lineage"], j["budget"].to_dict(), j["names"][k], f, mine)
            if outcome is not None:  # the run's failures are paired with the resumes of every fold
                outcome.recoveries = [r for r in recoveries(before) if r.get(FOLD) == k and r.get(FAMILY, f) == f]
            done[(f, k)] = outcome
    return done


def _fit_shared(
    prepared: Prepared,
    config: Config,
    run_name: str,
    fams: dict[str, dict[str, Any]],
    todo: dict[str, dict[str, Any]],
    shared: bool,
    on_report: Callable[[dict[str, Any]], None],
    auto_time: dict[str, float] | None,
    not_earning: dict[str, Any] | None,
) -> list[tuple[tuple[str | None, int | None], tuple[Any, dict[str, Any]]]]:
    """train_shared's one Ray Train run (or local fit) of the families in todo: each checkpoint it reported with its
    (family, fold) (family None: the run's one family), as Ray Train's best_checkpoints holds them."""
    get_run_logger().info(
        "training %s %sin one Ray Train run %s: %s worker(s)%s; %s each; storage %s",
        ", ".join(f"{f} (folds {', '.join(map(str, j['folds']))})" for f, j in todo.items()),
        "one family after another " if shared else "",
        run_name,
        "1" if shared else config.scaling.workers_label,
        ", GPU" if config.scaling.use_gpu and not shared else "",
        "; ".join(f"{f}: {j['budget'].describe()}" for f, j in todo.items()),
        config.storage_path,
    )
    if shared:  # a failure an earlier attempt recorded is tried again (and the rule applied again)
        for j in todo.values():
            for record in (FAILED_FILE, LEFT_OUT_FILE):
                fs, inner = filesystem_for(join(j["home"], record))
                if fs.get_file_info(inner).type == FileType.File:
                    fs.delete_file(inner)
    path = run_dir(config, run_name)
    one_split = not prepared.folds
    os.environ[WORKER_GROUP_START_TIMEOUT] = f"{config.failure.worker_start_timeout_s:g}"
    sets = [(prepared.train, prepared.val)] if one_split else prepared.folds  # one split: the families' fold 0
    local = in_process(
        config, run_scaling({f: j["config"] for f, j in todo.items()}), prepared.rows, prepared.materialized
    )
    if not local:  # a fit in this process (Ray Train's local mode) of rows it holds needs no Ray
        ensure_ray(**config.ray_start)
    with fit_reports(path, on_report, local) as callbacks:
        if shared:
            trainer = build_shared_trainer(
                {f: j["config"] for f, j in todo.items()},
                prepared.preprocessor,
                run_name,
                [(f, j["run"][len(run_name) + 1 :], j["folds"], j["after"]) for f, j in todo.items()],
                {k: sets[k] for k in sorted({k for j in todo.values() for k in j["folds"]})},
                {f: j["lineage"] for f, j in todo.items()},
                callbacks=callbacks,
                cache_shards=prepared.materialized,
                auto_time=auto_time,
                not_earning=not_earning,
                local=local,
                fold_train_rows=fold_train_rows(prepared),
            )
        else:
            ((only, j),) = fams.items()
            trainer = build_trainer(
                j["config"],
                prepared.preprocessor,
                None,
                None,
                run_name,
                cache_shards=prepared.materialized,
                streamed=not prepared.materialized,
                external_memory=j["budget"].external_memory,
                lineage=j["lineage"],
                callbacks=callbacks,
                folds={k: prepared.folds[k] for k in j["folds"]},
                local=local,
                fold_train_rows=fold_train_rows(prepared),
            )
        result = fit_run(trainer, path, config.scaling.workers_label, config.data.materialize)
    if not shared:
        check_not_stopped(result)
    if local:
        return [((f, k), c) for f, j in todo.items() for k in j["folds"] for c in local_checkpoints([j["folders"][k]])]
    return [((m.get(FAMILY), m.get(FOLD)), (ckpt, m)) for ckpt, m in result.best_checkpoints or []]


def _left_out_in_shared_run(
    family: str,
    job: dict[str, Any],
    reported: dict[tuple[str, int], list[dict[str, Any]]],
    done: dict[tuple[str, int], TrainOutcome | None],
) -> str | None:
    """Why the not-earning rule left out a family's other folds in a shared run, or None. The worker's record
    (LEFT_OUT_FILE) is read from storage, so it counts only where what the run trained agrees (its first fold trained,
    none of its others), and its text is redacted."""
    first, *others = job["folds"]
    if not (reported[(family, first)] or done[(family, first)]) or any(
        reported[(family, k)] or done[(family, k)] for k in others
    ):
        return None
    try:
        why = json.loads(read_text(join(job["home"], LEFT_OUT_FILE)))["why"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return redact_text(why)[:2000] if isinstance(why, str) else None


def _failed_in_shared_run(
    family: str, job: dict[str, Any], reported: dict[tuple[str, int], list[dict[str, Any]]]
) -> str | None:
    """Why a family failed inside a shared run: its code raised (FAILED_FILE), its loss diverged, or a fold of it
    reported no checkpoint (a restart resumed past it); None: it trained."""
    try:
        return "its training raised " + str(json.loads(read_text(join(job["home"], FAILED_FILE)))["error"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for k in job["folds"]:
        stopped = [c["metrics"][STOP_REASON] for c in reported[(family, k)] if c["metrics"].get(STOP_REASON)]
        if stopped:
            return f"training stopped: {stopped[-1]}; {LOWER_THE_RATE}"
        if not reported[(family, k)]:
            return f"its fold {k} reported no checkpoint"
    return None


def _finish_folds(
    config: Config,
    family: str,
    job: dict[str, Any],
    done: dict[tuple[str, int], TrainOutcome | None],
    reported: dict[tuple[str, int], list[dict[str, Any]]],
    events: list[dict[str, Any]],
    train_s: float,
    earlier: dict[Any, set[str]],
    shared: bool,
    logged: set[tuple[str, Any, int]],
    row: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[TrainOutcome]:
    """A family's fold outcomes after its run: each fold's checkpoints and events, what earlier attempts left removed,
    the epochs the reports grouped away logged to MLflow, its finished record written."""
    log = get_run_logger()
    budget = job["budget"].to_dict()
    theirs = [e for e in events if e.get(FAMILY, family) == family]
    outcomes = []
    for k in job["folds"]:
        folder, name = job["folders"][k], job["names"][k]
        outcome = done[(family, k)] or _fold_outcome(
            k, folder, name, family, reported[(family, k)], events, budget, train_s
        )
        remove_left_over(
            folder, earlier[(family, k) if shared else k], {folder_name(c["path"]) for c in outcome.checkpoints}, name
        )
        if "mlflow" in job:  # trained in this fit (a family every fold of which finished before has none)
            log_rows(
                config.mlflow.tracking_uri,
                job["mlflow"],
                [row({**h, FOLD: k}) for h in outcome.history if (family, k, int(h.get("epoch", -1))) not in logged],
            )
        outcomes.append(outcome)
        if done[(family, k)] is None:
            write_text(
                join(folder, FINISHED_FILE),
                json.dumps({"lineage": job["lineage"], "budget": budget, "outcome": asdict(outcome)}, default=str),
            )
    resized = run_resizes(theirs)
    if resized and "mlflow" in job:
        outcomes[0].resizes = resized
        tag_run(
            config.mlflow.tracking_uri, job["mlflow"], "trainflow.resizes", "; ".join(map(describe_resize, resized))
        )
    unit = job["budget"].unit
    if any(o.run_name != job["run"] for o in outcomes):  # cross-fitted: each fold's run is a folder of the family's
        done_text = "; ".join(f"fold {o.run_name.rsplit('fold', 1)[-1]}: {len(o.history)} {unit}(s)" for o in outcomes)
        log.info("trained folds %s of %s: %s", ", ".join(map(str, job["folds"])), job["run"], done_text)
    else:
        log.info("trained %s: %s", job["run"], "; ".join(f"{len(o.history)} {unit}(s)" for o in outcomes))
    return outcomes
