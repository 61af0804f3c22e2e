"""Task: pick the best checkpoint by the configured metric, proven loadable."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.trainer.resolve import allowed_class_paths, check_class_path
from trainflow.tasks.values import TrainOutcome, Selected
from trainflow.trainer.serving.checkpoint import metric_value
from trainflow.trainer.serving.servable import load_servable
from trainflow.config import Config
from trainflow.errors import CheckpointError
from trainflow.run.storage import private_copy


def rank_checkpoints(checkpoints: list[dict[str, Any]], metric: str, mode: str) -> tuple[list[dict], list[dict]]:
    """(candidates best first, skipped ones with the reason) by metric and mode."""
    usable, skipped = [], []
    for c in checkpoints:
        if metric_value(c["metrics"], metric) is None:
            skipped.append({"path": c["path"], "reason": f"metric {metric} is missing or not finite"})
        else:
            usable.append(c)
    usable.sort(key=lambda c: metric_value(c["metrics"], metric), reverse=(mode == "max"))
    return usable, skipped


@task(name="select", cache_policy=NO_CACHE)
def select(outcome: TrainOutcome, config: Config, latest: bool = False) -> Selected:
    """The best checkpoint whose files load; worse ones are the fallback, with a warning for each skipped. latest: the
    newest instead (a refit's model is its last round: its reports are on rows it trained on, which rank nothing)."""
    return _pick(outcome, config, get_run_logger(), latest)


@task(name="select", cache_policy=NO_CACHE)
def select_each(outcomes: dict[str, list[TrainOutcome]], config: Config) -> dict[str, list[Selected]]:
    """select's choice for every fold of every family of a retrain, in one task run (a task run per fold was
    about 70 ms of Prefect's task engine each: 1.4 s of a 150-row retrain's 20 fold models)."""
    log = get_run_logger()
    return {family: [_pick(o, config, log) for o in folds] for family, folds in outcomes.items()}


def _pick(outcome: TrainOutcome, config: Config, log, latest: bool = False) -> Selected:
    metric, mode = config.checkpoint.metric, config.checkpoint.mode
    if latest:
        candidates, skipped = sorted(outcome.checkpoints, key=lambda c: c["epoch"], reverse=True), []
    else:
        candidates, skipped = rank_checkpoints(outcome.checkpoints, metric, mode)
    for c in candidates:
        try:
            local = private_copy(c["path"])  # checked here, read by every later step
            check_class_path(local, allowed_class_paths(config), c["path"])
            load_servable(local)
        except Exception as exc:  # noqa: BLE001 - a truncated file raises anything from EOFError to RuntimeError
            skipped.append({"path": c["path"], "reason": f"cannot be loaded: {type(exc).__name__}: {exc}"})
            log.warning("skipping checkpoint %s: cannot be loaded (%s)", c["path"], exc)
            continue
        for s in skipped:
            log.warning("skipped checkpoint %s: %s", s["path"], s["reason"])
        value = metric_value(c["metrics"], metric)
        figure = f"{metric} = {value:.5g}" if value is not None else f"{metric} not reported"
        log.info("selected epoch %d%s: %s (%s)", c["epoch"], " (the last)" if latest else "", figure, c["path"])
        return Selected(path=local, epoch=c["epoch"], metrics=c["metrics"], skipped=skipped, uri=c["path"])
    reasons = "; ".join(f"{s['path']}: {s['reason']}" for s in skipped) or "no checkpoints were kept"
    raise CheckpointError(f"run {outcome.run_name} has no usable checkpoint by {metric}: {reasons}")
