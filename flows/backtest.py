"""The backtest's earlier model: the chosen family trained once more by the same procedure, cut off one validation
block earlier (FoldPlan.earlier), so that the final scoring can score both on the test rows and say what a model's
age costs (trainer/backtest.py earlier_comparison).

The recent model is the one the plan's cutoff made: with one split the chosen family's selected checkpoint (it trained
on the training role and early-stopped on the validation role, the newest rows before the test rows); with
cross-fitting its newest fold model (fold 0 holds out the newest block of time and trains on every older one). The
earlier model trains on the recent model's training rows less its newest block, as many rows as the recent model
early-stopped on, and early-stops on that block: the same procedure, moved back in time by that block's span. An
ensemble's backtest trains its heaviest member.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, TypeVar

from trainflow.config import ENSEMBLE, Config
from trainflow.data import earlier_parts
from trainflow.errors import ConfigError, DataError, TrainingError, disk_full
from trainflow.run.redact import redact_text
from trainflow.run.runtime import stop_requested
from trainflow.preprocessors.fit import pack
from trainflow.tasks.common import task_logger, lineage_for
from trainflow.tasks.mlflow_run import end_runs
from trainflow.tasks.values import EarlierFit, Prepared, Selected, Split, TrainOutcome
from trainflow.tasks.select import select
from trainflow.tasks.train import train, train_shared
from trainflow.trainer.deadline import MIN_RUN_S, set_deadline
from trainflow.run.storage import join
from trainflow.trainer.runner import latest_lineage, run_dir
from trainflow.trainer.session import fold_folder

T = TypeVar("T")


def backtest_family(chosen: str, weights: dict[str, float] | None) -> str:
    """The family the backtest trains again: the chosen one, or an ensemble's heaviest member."""
    if chosen != ENSEMBLE or not weights:
        return chosen
    return max(weights, key=weights.get)


def fit_earlier(
    config: Config,
    run_config: Config,
    parts: Split,
    prepared: Prepared,
    family: str,
    recent: str,
    run_name: str,
    ends_at: float | None,
) -> EarlierFit:
    """Train the earlier model of family (recent: the recent model's selected checkpoint folder) under run_name,
    by ends_at (the time budget's end, None: no limit); an EarlierFit whose `skipped` says why when there is none."""
    plan, log = parts.plan, task_logger("backtest")
    if not config.split.backtest_fit:
        return EarlierFit(family, None, None, skipped="split.backtest_fit is false")
    if plan is None or plan.time_column is None:
        return EarlierFit(family, None, None, skipped="roles are not by time")
    if plan.earlier is None:
        return EarlierFit(family, None, None, skipped="too few training rows to cut a block off")
    if ends_at is not None and ends_at - time.time() < MIN_RUN_S:
        why = f"the time budget had {max(0.0, ends_at - time.time()):.0f} s left (train.time_limit)"
        log.info("backtest: no earlier model: %s", why)
        return EarlierFit(family, None, None, skipped=why)
    train_rows, held_rows = earlier_parts(parts.train, plan, parts.materialized)
    packed_train, packed_val = pack(train_rows, held_rows, prepared.preprocessor, prepared.materialized)
    mine = replace(prepared, train=packed_train, val=packed_val, folds=None, warm=None)  # older rows: never warm
    shift = plan.earlier["recent_end"] - plan.earlier["end"]
    log.info(
        "backtest: training %s again as %s on its %d oldest rows to %s (early-stopping on the next %d), "
        "cut off %s before the model it is compared with",
        family,
        run_name,
        int(plan.earlier["rows"]),
        plan.time_text(plan.earlier["end"]),
        int(plan.earlier["validation_rows"]),
        _span(plan, shift),
    )
    # a report, not the model: its failure is said and the run goes on
    fitted = extra_fit(config, run_config, mine, family, run_name, f"train-{family}-earlier", ends_at)
    if isinstance(fitted, str):
        log.warning("backtest: no earlier model: %s", fitted)
        return EarlierFit(family, None, None, skipped=fitted)
    outcome, chosen = fitted
    if outcome.time_limited_at is not None:  # stopped by the budget, not by early stopping: worse for want of time
        why = (
            f"its fit {run_name} was cut short by the time budget after {outcome.budget.get('unit', 'epoch')} "
            f"{outcome.time_limited_at}: a model short of training would overstate what age costs"
        )
        log.info("backtest: no earlier model: %s", why)
        return EarlierFit(family, None, None, skipped=why)
    return EarlierFit(family, recent, chosen.path, shift, run_name)


def extra_fit(
    config: Config,
    fit_config: Config,
    prepared: Prepared,
    family: str,
    run_name: str,
    task_run_name: str,
    ends_at: float | None,
    latest: bool = False,
) -> tuple[TrainOutcome, Selected] | str:
    """A fit beside the retrain's own (the backtest's earlier model, a refit): family trained on prepared's rows with
    fit_config under run_name by the train task (with config's failure retries) by ends_at, its checkpoint selected,
    its MLflow run ended (latest: its newest checkpoint, as tasks/select.py select's); (the outcome, its selection),
    or why there is none: the run folder holds another table's or
    config's run (left as it is), or the fit failed (the retrain goes on without it). A stop, a bad config or input
    and a full disk fail the run."""
    folder = run_dir(fit_config, run_name)
    held = held_by_another(folder, fit_config, prepared.fingerprint, family)
    if held:
        return held
    set_deadline(folder, ends_at, "train.time_limit" if ends_at else "")

    def fit(_ended: dict[str, str]) -> tuple[TrainOutcome, Selected]:
        outcome = train.with_options(task_run_name=task_run_name, **_retries(config))(
            prepared, fit_config, run_name, family
        )
        return outcome, select(outcome, config, latest)

    return _attempted(config, {family: run_name}, fit)


def extra_fits(
    config: Config,
    fit_configs: dict[str, Config],
    prepared: Prepared,
    run_name: str,
    runs: dict[str, str],
    task_run_name: str,
    ends_at: float | None,
    latest: bool = False,
) -> dict[str, tuple[TrainOutcome, Selected]] | str:
    """extra_fit of several one-worker families in one Ray Train run run_name, one after another in one worker
    (tasks/train.py train_shared: Ray Train's start paid once): each family (fit_configs: its config) under its run
    runs[family], a folder of run_name. {family: (its outcome, its selection)}, or why there is none for any: a run
    folder held by another run, or a fit that failed (a family's own failure in the run included)."""
    for family, run in runs.items():  # one split in a shared run: its checkpoints in the run's fold 0 folder
        folder = join(run_dir(fit_configs[family], run), fold_folder(0))
        held = held_by_another(folder, fit_configs[family], prepared.fingerprint, family)
        if held:
            return held
    set_deadline(run_dir(config, run_name), ends_at, "train.time_limit" if ends_at else "")
    jobs = [(family, run, [0], 0) for family, run in runs.items()]

    def fit(ended: dict[str, str]) -> dict[str, tuple[TrainOutcome, Selected]]:
        outcomes, failed, _ = train_shared.with_options(task_run_name=task_run_name, **_retries(config))(
            prepared, config, run_name, jobs, configs=fit_configs
        )
        if failed:  # each family's MLflow run ends as its fit did; none of them serves
            ended.update({**{family: "FINISHED" for family in outcomes}, **{family: "FAILED" for family in failed}})
            raise TrainingError("; ".join(f"{family}: {why}" for family, why in failed.items()))
        return {family: (got[0], select(got[0], config, latest)) for family, got in outcomes.items()}

    return _attempted(config, runs, fit)


def _retries(config: Config) -> dict[str, Any]:
    return {"retries": config.failure.task_retries, "retry_delay_seconds": config.failure.retry_delay_s}


def _attempted(config: Config, runs: dict[str, str], fit: Callable[[dict[str, str]], T]) -> T | str:
    """fit(ended), or why it failed: a stop, a bad config or input and a full disk raise; the families' MLflow runs
    (runs: family -> its run) ended however it went (as fit recorded in ended for a family, else as fit ended)."""
    status, ended = "FAILED", {}
    try:
        got = fit(ended)
        status = "FINISHED"
        return got
    except Exception as exc:  # noqa: BLE001 - anything a fit raises, as train_families sorts it
        if isinstance(exc, (ConfigError, DataError)) or stop_requested(exc) or disk_full(exc):
            raise
        return redact_text(f"the fit {', '.join(runs.values())} failed: {type(exc).__name__}: {exc}")[:500]
    finally:
        for family, run in runs.items():
            end_runs(config, [run], family, "KILLED" if stop_requested() else ended.get(family, status))


def held_by_another(folder: str, config: Config, fingerprint: str, family: str) -> str | None:
    """Why an extra fit's run folder (the backtest's, a refit's) cannot be used, or None: check_resume's rule for
    it too, never resume onto another table or config, and never delete what is there."""
    before = latest_lineage(folder)
    now = lineage_for(config, fingerprint, family)
    if before is not None and any(before.get(k) != v for k, v in now.items()):
        return f"{folder} holds a run of other data or another training config; it is left as it is"
    return None


def _span(plan, shift: float) -> str:
    if plan.time_kind == "timestamp":
        return f"{shift / 86400.0:.1f} days"
    return f"{shift:g} days" if plan.time_kind == "date" else f"{shift:g} units"
