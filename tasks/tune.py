"""Task: a Ray Tune sweep of Ray Train runs (any model family); the best trial's run goes on to select/register/promote."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.tasks.common import retry_unless_user_error, artifact_key
from trainflow.tasks.values import Prepared, TrainOutcome
from trainflow.trainer.serving.checkpoint import METRICS_FILE
from trainflow.trainer.progress import ProgressLine, watch_progress
from trainflow.trainer.recovery import read_events, recoveries
from trainflow.trainer.resources import check_fits, concurrent_runs
from trainflow.trainer.runner import checkpoints_on_disk, run_dir
from trainflow.trainer.tune import best_trial, build_tuner, can_restore, check_restore, summarize_trials
from trainflow.config import Config, trial_config
from trainflow.errors import TrainingError
from trainflow.run.runtime import ensure_ray
from trainflow.run.storage import join, read_text


@dataclass
class Swept:
    sweep: str
    trials: list[dict[str, Any]]
    best_trial: dict[str, Any]
    best_config: Config
    outcome: TrainOutcome  # the best trial's Train run
    max_concurrent_trials: int


def concurrency(config: Config, nodes: list[dict[str, float]] | None = None) -> int:
    """Trials at once: as many worker groups as the cluster holds, capped by tune.max_concurrent_trials."""
    fit = concurrent_runs(config.scaling.model_dump(), nodes)
    cap = config.require_tune().max_concurrent_trials
    return min(fit, cap) if cap else fit


@task(name="check-sweep", cache_policy=NO_CACHE)
def check_sweep(config: Config, sweep: str, resume: bool) -> None:
    """Before any work: an existing sweep folder is restored only on request (its tuner.pkl is a pickle)."""
    check_restore(run_dir(config, sweep), sweep, resume)


# the sweeps this process started: a Prefect retry of the tune task restores its own sweep (Ray Tune's resume_errored
# keeps the trials that finished and tries the errored ones again) instead of refusing the folder its first attempt
# made; a sweep folder this process did not start is restored only on request (--resume)
_STARTED: set[str] = set()


@task(name="tune", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def tune_sweep(prepared: Prepared, config: Config, sweep: str, resume: bool = False) -> Swept:
    """Run the sweep (restoring it only when resume is asked for) and pick the best trial."""
    tune_cfg = config.require_tune()
    ensure_ray(**config.ray_start)
    check_fits(config.scaling.model_dump())
    log = get_run_logger()
    parallel = concurrency(config)
    path = run_dir(config, sweep)
    if not resume and path in _STARTED and can_restore(path):
        log.warning("sweep %s: this retry restores the sweep its first attempt started", sweep)
        resume = True
    _STARTED.add(path)
    log.info(
        "sweep %s: %d trial(s), %d at a time, %s on %s (%s)",
        sweep,
        tune_cfg.num_samples,
        parallel,
        tune_cfg.scheduler,
        tune_cfg.metric,
        tune_cfg.mode,
    )
    lines: dict[str, ProgressLine] = {}

    def on_report(metrics: dict[str, Any]) -> None:
        # a line per trial report: 'trial 5d1e2_00001: mlp epoch 3: train_loss ...'
        trial, family = str(metrics.get("trial", "?")), str(metrics.get("family", ""))
        budget = prepared.budgets.get(family)
        line = lines.setdefault(trial, ProgressLine(family, None, getattr(budget, "unit", "epoch")))
        log.info("trial %s: %s", trial, line(metrics))

    with watch_progress(on_report) as progress:
        tuner = build_tuner(
            config,
            prepared.preprocessor,
            prepared.train,
            prepared.val,
            sweep,
            parallel,
            cache_shards=prepared.materialized,
            external_memory={name: b.external_memory for name, b in prepared.budgets.items()},
            resume=resume,
            progress=progress,
        )
        results = tuner.fit()
    trials = summarize_trials(results, sweep, tune_cfg.metric, tune_cfg.mode)
    best = best_trial(trials, tune_cfg.metric, tune_cfg.mode)
    create_table_artifact(
        table=[{**{k: v for k, v in t.items() if k != "params"}, **t["params"]} for t in trials],
        key=artifact_key(config.mlflow.registered_model, "tune-trials"),
        description=f"Trials of sweep {sweep}",
    )
    if best is None:
        errors = (
            "; ".join(f"{t['trial_id']}: {t['error']}" for t in trials if t["error"]) or "no trial reported the metric"
        )
        raise TrainingError(f"sweep {sweep}: no trial finished with a finite {tune_cfg.metric} ({errors})")
    best_config = trial_config(config.to_dict(), best["params"])
    best_config._source_dir = config.source_dir
    path = run_dir(best_config, best["run_name"])
    checkpoints = checkpoints_on_disk(path)
    if not checkpoints:
        raise TrainingError(f"sweep {sweep}: the best trial {best['trial_id']} kept no checkpoint in {path}")
    history = json.loads(read_text(join(checkpoints[-1]["path"], METRICS_FILE)))["history"]
    log.info("best trial %s: %s=%s with %s", best["trial_id"], tune_cfg.metric, best[tune_cfg.metric], best["params"])
    outcome = TrainOutcome(
        run_name=best["run_name"],
        family=best_config.model.families[0],
        run_path=path,
        checkpoints=checkpoints,
        history=history,
        recoveries=recoveries(read_events(path)),
    )
    return Swept(sweep, trials, best, best_config, outcome, parallel)
