"""The tune flow: ingest -> split -> preprocess -> tune (Ray Tune over TorchTrainer) -> select -> register -> promote -> infer."""

from __future__ import annotations

from typing import Any

from prefect import flow

from trainflow.flows.handover import flow_config
from trainflow.flows.publish import publish
from trainflow.tasks.approval import check_answerable
from trainflow.tasks.ingest import ingest, pin_source
from trainflow.tasks.preprocess import preprocess
from trainflow.tasks.run_name import resolve_run_name
from trainflow.tasks.select import select
from trainflow.tasks.common import task_logger
from trainflow.tasks.split import record_split, split
from trainflow.tasks.tune import check_sweep, tune_sweep
from trainflow.tasks.validate import validate_data
from trainflow.trainer.tune import sweep_space
from trainflow.run.locks import run_lock
from trainflow.run.runtime import plain_progress, watch_for_sigterm


@flow(name="tune", log_prints=True)
def tune(
    config_path: str,
    overrides: dict[str, Any] | None = None,
    run_name: str | None = None,
    resume: bool = False,
    wait: bool = True,
) -> dict[str, Any]:
    """Sweep the config's tune.search_space; the best trial's best checkpoint is registered and gated.
    resume: restore the sweep named run_name from its folder (which unpickles Ray Tune's state: your own only).
    One start per sweep name at a time (wait=False: fail at once naming the holder)."""
    watch_for_sigterm()  # a cancel (SIGTERM) stops Ray at once and retries nothing, in every process that runs a flow
    plain_progress()  # MLflow's transfer bars in a terminal only
    config = flow_config(config_path, overrides)
    check_answerable(config)  # a required approval: only a deployment's run can wait for it
    sweep_space(config)  # before any work: a family with no default space and no tune.search_space fails here
    sweep = resolve_run_name(run_name, prefix="tune")
    with run_lock(config.storage_path, sweep, wait):
        config = pin_source(config, sweep)  # a snapshot or a PostgreSQL copy: what the sweep and its resume read
        return _tune(config, sweep, resume)


def _tune(config, sweep: str, resume: bool) -> dict[str, Any]:
    check_sweep(config, sweep, resume)
    ingested = ingest(config)
    parts = split(ingested, config, folds=1)  # a trial trains one model: one validation split
    if config.train.warm_start != "none":
        task_logger("tune").warning("train.warm_start %s: a sweep's trials fit fresh", config.train.warm_start)
    prepared = preprocess(ingested, parts, config, warm=False)
    validation = validate_data(config, prepared.preprocessor)
    parts = record_split(ingested, config, parts, sweep)
    swept = tune_sweep(prepared, config, sweep, resume)
    best = swept.best_config
    selected = select(swept.outcome, best)
    return publish(
        best,
        ingested,
        parts,
        swept.outcome,
        selected,
        {
            "sweep": swept.sweep,
            "trials": swept.trials,
            "best_trial": swept.best_trial,
            "max_concurrent_trials": swept.max_concurrent_trials,
            "tune_metric": config.require_tune().metric,
            "tune_mode": config.require_tune().mode,
            "validation": validation,
        },
        run_name=sweep,
    )
