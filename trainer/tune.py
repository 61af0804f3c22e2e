"""Ray Tune over Ray Train runs of any model family (model.type may itself be searched): one Train run per trial, launched from a driver function (Train V2 + Tune).

Each trial's Train run is named <sweep name>-<trial id>, with no timestamp, so a restored sweep
resumes every unfinished trial from its own latest checkpoint.
"""

from __future__ import annotations

import math
from typing import Any

import ray.data
import ray.tune
from ray.train.v2.api.callback import UserCallback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.limits import MAX_AUTO_EPOCHS
from trainflow.trainer.families import REGISTRY
from trainflow.trainer.progress import ProgressCallback
from trainflow.trainer.runner import build_trainer, run_dir
from trainflow.config import Config, trial_config
from trainflow.errors import ConfigError
from trainflow.run.storage import list_dir


def search_space(space: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    """The config's search_space as Ray Tune sampling objects, keyed by dotted config key."""
    make = {
        "loguniform": lambda a: ray.tune.loguniform(*a),
        "uniform": lambda a: ray.tune.uniform(*a),
        "randint": lambda a: ray.tune.randint(*a),
        "choice": lambda a: ray.tune.choice(a),
        "grid": lambda a: ray.tune.grid_search(a),
    }
    return {key: make[kind](args) for key, spec in space.items() for kind, args in spec.items()}


def sweep_space(config: Config) -> dict[str, dict[str, list[Any]]]:
    """What a sweep samples: tune.search_space, or else every trained family's default space (its Family's
    search_space, keys it does not read are ignored by the others); with several families (model.type auto or a
    list) the family itself is searched too (model.type: choice), unless the space names it."""
    space = dict(config.require_tune().search_space)
    families = config.model.families
    if not space:
        for family in families:
            space.update(REGISTRY[family].search_space)
        if not space:
            raise ConfigError(f"tune: model.type {families[0]} has no default search space; give tune.search_space")
    if len(families) > 1 and "model.type" not in space:
        space["model.type"] = {"choice": list(families)}
    return space


def _searched_families(config: Config) -> list[str]:
    spec = sweep_space(config).get("model.type")
    return config.model.families if spec is None else list(next(iter(spec.values())))


def trial_run_name(sweep: str, trial_id: str) -> str:
    return f"{sweep}-{trial_id}"


def train_driver_fn(
    params: dict[str, Any],
    base_config: dict,
    preprocessor: dict,
    train_ds: ray.data.Dataset,
    val_ds: ray.data.Dataset,
    sweep: str,
    cache_shards: bool = False,
    external_memory: dict[str, bool] | None = None,
    progress: ProgressCallback | None = None,
) -> None:
    """One trial: the base config with this trial's sampled values, trained by its family's Ray Train trainer.
    external_memory: per family, the preprocess task's auto choice (in memory for a family it did not check);
    progress: the sweep's progress queue, which gets this trial's reports tagged with its id."""
    cfg = trial_config(base_config, params["sampled"])
    cfg = cfg.for_family(cfg.model.type)  # the trial's family reads its own model.params block
    name = trial_run_name(sweep, ray.tune.get_context().get_trial_id())
    family = cfg.model.type
    external = REGISTRY[family].uses_external_memory(
        cfg.model.params.external_memory, (external_memory or {}).get(family, False)
    )
    from ray.util.queue import Queue

    reports = Queue(actor_options={"num_cpus": 0})  # unbounded: the controller's put never waits on the trial
    callbacks: list = [TrialReports(reports)]
    if progress is not None:
        callbacks.append(progress.tagged(trial=ray.tune.get_context().get_trial_id(), family=family))
    trainer = build_trainer(
        cfg,
        TabularPreprocessor.from_dict(preprocessor),
        train_ds,
        val_ds,
        name,
        callbacks=callbacks,
        cache_shards=cache_shards,
        streamed=not cache_shards,
        external_memory=external,
    )
    fit_reporting(trainer, reports)


class TrialReports(UserCallback):
    """On a trial's Ray Train controller: each report's metrics (rank 0's, with its checkpoint's path, as Ray's
    TuneReportCallback gives them) onto the trial's own unbounded queue, which the trial's thread hands to Tune
    (fit_reporting). Ray's TuneReportCallback passes them through a one-item queue read with timed gets, and on 2 cores
    a report went missing now and then: a trial without its metric (Tune's error), or a sweep waiting forever."""

    def __init__(self, queue) -> None:
        self.queue = queue

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        item = dict(metrics[0])
        if checkpoint is not None:
            item["checkpoint_path"] = checkpoint.path
        self.queue.put_nowait(item)


def fit_reporting(trainer, reports, poll_s: float = 0.2) -> None:
    """trainer.fit() on a thread while this trial's thread reports every item of the queue to Tune in order (untimed
    reads: nothing is lost), the last ones after the fit ends; the fit's error is raised once they are reported."""
    import threading

    from ray.util.queue import Empty

    ended, failed = threading.Event(), []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - raised in the trial's thread below
            failed.append(exc)
        finally:
            ended.set()

    threading.Thread(target=fit, name="trainflow-trial-fit", daemon=True).start()
    while True:
        last = ended.wait(poll_s)  # every report was queued before the fit returned
        while True:
            try:
                ray.tune.report(reports.get_nowait())
            except Empty:
                break
        if last:
            break
    if failed:
        raise failed[0]


def can_restore(path: str) -> bool:
    """Whether path holds a sweep Ray Tune can restore (its tuner.pkl)."""
    return ray.tune.Tuner.can_restore(path)


def check_restore(path: str, sweep: str, resume: bool) -> None:
    """ConfigError unless the sweep folder's state matches the request: resume needs one, a new sweep none."""
    if resume and not can_restore(path):
        raise ConfigError(f"tune --resume: no sweep to restore at {path}")
    if not resume and list_dir(path):
        raise ConfigError(
            f"sweep {sweep}: {path} exists. Restoring it unpickles its tuner.pkl, so trainflow does that only when "
            "asked: pass --resume if this is your sweep, or choose another --run-name"
        )


def build_tuner(
    config: Config,
    preprocessor: TabularPreprocessor,
    train_ds: ray.data.Dataset,
    val_ds: ray.data.Dataset,
    sweep: str,
    max_concurrent_trials: int,
    cache_shards: bool = False,
    external_memory: dict[str, bool] | None = None,
    resume: bool = False,
    progress: ProgressCallback | None = None,
) -> ray.tune.Tuner:
    """A Tuner for config['tune']: new, or restored from the sweep's folder when resume is asked for.

    Restoring unpickles the folder's tuner.pkl (Ray Tune's format), so it happens only on request, never
    because a folder of that name exists: anyone who can write to storage_path could have put it there."""
    tune_cfg = config.require_tune()
    trainable = ray.tune.with_parameters(
        train_driver_fn,
        base_config=config.to_dict(),
        preprocessor=preprocessor.to_dict(),
        train_ds=train_ds,
        val_ds=val_ds,
        sweep=sweep,
        cache_shards=cache_shards,
        external_memory=external_memory,
        progress=progress,
    )
    # The driver only waits on its TorchTrainer; the Train workers ask for their own resources. Tune
    # refuses an empty request, and any CPU here would come out of the workers' budget: one byte of memory.
    trainable = ray.tune.with_resources(trainable, {"memory": 1})
    path = run_dir(config, sweep)
    check_restore(path, sweep, resume)
    if resume:
        return ray.tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
    if tune_cfg.scheduler == "asha":
        # rungs by epoch, not by report: short epochs are grouped into one report (checkpoint.min_interval_s)
        # (boosted trees report their round as the epoch)
        max_t = 1
        for f in _searched_families(config):  # networks: epochs; boosters: rounds (each family's own)
            if REGISTRY[f].uses_minibatches:
                epochs = REGISTRY[f].train_section(config.for_family(f)).epochs
                max_t = max(max_t, epochs if epochs != "auto" else MAX_AUTO_EPOCHS)
            else:
                max_t = max(max_t, config.for_family(f).model.params.num_boost_round)
        scheduler = ASHAScheduler(
            time_attr="epoch",
            max_t=max_t,
            grace_period=min(tune_cfg.grace_period, max_t),
            reduction_factor=tune_cfg.reduction_factor,
        )
    else:
        scheduler = FIFOScheduler()
    return ray.tune.Tuner(
        trainable,
        param_space={"sampled": search_space(sweep_space(config))},
        tune_config=ray.tune.TuneConfig(
            metric=tune_cfg.metric,
            mode=tune_cfg.mode,
            num_samples=tune_cfg.num_samples,
            max_concurrent_trials=max_concurrent_trials,
            scheduler=scheduler,
        ),
        run_config=ray.tune.RunConfig(name=sweep, storage_path=config.storage_path, verbose=0),
    )


def summarize_trials(results: ray.tune.ResultGrid, sweep: str, metric: str, mode: str) -> list[dict[str, Any]]:
    """One row per trial: id, Train run name, sampled values, best metric, epochs, time span, status."""
    rows = []
    for result in results:
        df = result.metrics_dataframe
        trial_id = (result.metrics or {}).get("trial_id") or result.path.rstrip("/").rsplit("/", 1)[-1]
        values = [] if df is None or metric not in df else [float(v) for v in df[metric] if v == v]
        best = (min(values) if mode == "min" else max(values)) if values else None
        start = end = None
        if df is not None and "timestamp" in df and len(df):
            end = float(df["timestamp"].max())
            start = float((df["timestamp"] - df.get("time_this_iter_s", 0)).min())
        rows.append(
            {
                "trial_id": trial_id,
                "run_name": trial_run_name(sweep, trial_id),
                "params": dict(result.config["sampled"]),
                metric: best,
                # reports group short epochs; the last reported epoch (0-based) counts the epochs run
                "epochs_run": 0 if df is None or "epoch" not in df or not len(df) else int(df["epoch"].max()) + 1,
                "status": "error" if result.error else "ok",
                "error": str(result.error).splitlines()[0][:300] if result.error else None,
                "started_at": start,
                "ended_at": end,
            }
        )
    return rows


def best_trial(rows: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any] | None:
    scored = [r for r in rows if r[metric] is not None and math.isfinite(r[metric])]
    if not scored:
        return None
    return (min if mode == "min" else max)(scored, key=lambda r: r[metric])
