"""The retrain flow: ingest -> split -> preprocess -> train (one Ray Train run per model family, fanned out; with
cross-fitting its folds one after another inside that run) -> select -> [out-of-fold predictions and bagged checkpoints] -> [ensemble]
-> [compare families] -> [refit the chosen boosters on every row that may train] -> calibrate -> score the test rows
-> register -> promote -> infer -> summary."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from prefect import flow
from prefect.exceptions import Pause
from prefect.futures import wait

from trainflow.flows.handover import flow_config
from trainflow.flows.predict import skipped_run
from trainflow.flows.publish import publish
from trainflow.flows.refit import refit, refit_reserve
from trainflow.tasks.candidates import compare, run_names
from trainflow.flows.backtest import backtest_family, fit_earlier
from trainflow.tasks.cross_fit import bag_folds, fold_run_names, oof_names, train_config
from trainflow.tasks.ensemble import ensemble
from trainflow.tasks.ingest import ingest, pin_source, table_fingerprint
from trainflow.tasks.values import Ingested, Prepared, Split, TrainOutcome, fit_history, recovered_families
from trainflow.tasks.mlflow_run import end_parent, end_runs, open_parent
from trainflow.tasks.preprocess import preprocess
from trainflow.tasks.run_name import finished_before, record_finished, resolve_run_name
from trainflow.tasks.retention import retain
from trainflow.tasks.approval import check_answerable, command_line_approval
from trainflow.tasks.select import select_each
from trainflow.tasks.skip import check_unchanged
from trainflow.tasks.split import record_split, split
from trainflow.tasks.train import SHARED_SUFFIX, check_resume, shared_run_name, train, train_folds, train_shared
from trainflow.tasks.validate import validate_data
from trainflow.tasks.warm import source_plan, summary_record
from trainflow.trainer.session import NOT_EARNING_MIN_ROWS, best_val_loss, not_earning
from trainflow.trainer.deadline import MIN_RUN_S, TimeShare, deadline_entry, set_deadline
from trainflow.roles.folds import ONE_WORKER_ROWS
from trainflow.limits import AUTO_FLOOR_S
from trainflow.trainer.resources import concurrent_runs
from trainflow.trainer.runner import run_dir, shared_scaling
from trainflow.config import ENSEMBLE, Config
from trainflow.errors import ConfigError, DataError, TrainingError, disk_full
from trainflow.run.locks import run_lock
from trainflow.retention import finish_removal, record_start
from trainflow.run.redact import redact_text
from trainflow.run.runtime import plain_progress, stop_requested, watch_for_sigterm
from trainflow.tasks.common import task_logger


@flow(name="retrain", log_prints=True)
def retrain(
    config_path: str,
    overrides: dict[str, Any] | None = None,
    run_name: str | None = None,
    force: bool = False,
    wait: bool = True,
    explained: bool = True,
    approve: str | None = None,
) -> dict[str, Any]:
    """Train, select, register and predict from one config file; returns the run summary. A run on the champion's
    own data and training config registers nothing (the champion still scores inference.input) unless force. One
    start per run name at a time: another start of the same name waits for it (wait=False: fails at once naming it),
    then finds it finished and does nothing. explained=False: no feature importance and no report artifacts (a
    replay's cutoff retrains, whose models only the replay judges). approve: with promotion.approval: required, the
    approval given with the run (its reason; the command line's --approve), recorded with its author."""
    watch_for_sigterm()  # a cancel (SIGTERM) stops Ray at once and retries nothing, in every process that runs a flow
    plain_progress()  # MLflow's transfer bars in a terminal only
    config = flow_config(config_path, overrides)
    if config.task_inferred:
        print(config.task_inferred)
    config = config.with_approval(command_line_approval(approve) if approve is not None else None)
    # nobody to answer a required approval: refused before anything starts
    check_answerable(config, config.approved is not None)
    name = resolve_run_name(run_name)
    with run_lock(config.storage_path, name, wait):
        finish_removal(config, name)  # retention's removal of this name cut short: finished before anything is read
        config = pin_source(config, name)  # a Delta or Iceberg table: the snapshot this run name reads
        # the champion's own data and config: nothing to train (checked before the table is read into Ray)
        fingerprint = None if force else table_fingerprint(config)
        done = finished_before(config, name, fingerprint) if run_name else None  # a default name is new every time
        if done:
            return done
        skipped = check_unchanged(config, fingerprint) if fingerprint else None
        if skipped:
            return skipped_run(config, name, skipped)
        summary = _retrain(config, name, fingerprint, explained)
        if run_name:
            record_finished(config, name, fingerprint or summary.get("data_fingerprint"), summary)
        # a retention task run only where a limit is set (unset: every run is kept)
        retained = retain(config, name) if config.retention.limited else None
        return {**summary, "retention": retained} if retained else summary


def _retrain(config: Config, name: str, fingerprint: str | None, explained: bool = True) -> dict[str, Any]:
    """Everything a retrain does once it knows there is something to train; the summary. Once every check passed,
    the retrain's MLflow run opens (each family's run nests under it) and ends as the retrain does (a refused
    config or table writes no MLflow record)."""
    ingested = ingest(config, fingerprint)
    runs = run_names(config, name)
    check_resume(config, ingested.spec.fingerprint, runs)
    parts = split(ingested, config)
    # each family sized for the workers it trains with (a small table's fits: one each)
    workers = train_config(config, parts.train_rows, parts.fold_count).scaling.max_workers
    prepared = preprocess(ingested, parts, config, workers=workers)
    runs = {f: r for f, r in runs.items() if f in prepared.budgets}  # auto leaves out a family that cannot fit
    validation = validate_data(config, prepared.preprocessor)
    record_start(config, name)  # every check passed: what retention may remove is what a retrain recorded it wrote
    parts = record_split(ingested, config, parts, name)
    k = parts.fold_count
    runs = {f: runs[f] for f in config.model.training_order(k) if f in runs}  # the order is their time priority
    # a small table: every family in one Ray Train run (one split: its fold 0)
    if shares_a_run(train_config(config, parts.train_rows, k), prepared, runs, k, parts.train_rows):
        runs = {f: f"{name}{SHARED_SUFFIX}/{r}" for f, r in runs.items()}
    if k > 1 or shared_run_name(runs):  # each fold's folder inside its family's run
        check_resume(config, ingested.spec.fingerprint, fold_run_names(runs, k))
    open_parent(config, name)
    status, summary = "FAILED", None
    try:
        summary = _train_and_publish(config, name, ingested, parts, prepared, runs, validation, explained)
        status = "FINISHED"
        return summary
    except Pause:  # suspended for a person's approval (tasks/approval.py): the same MLflow run goes on once resumed
        status = "RUNNING"
        raise
    finally:
        if status != "RUNNING":
            end_parent(config, "KILLED" if stop_requested() else status, summary)


def _train_and_publish(
    config: Config,
    name: str,
    ingested: Ingested,
    parts: Split,
    prepared: Prepared,
    runs: dict[str, str],
    validation: dict[str, Any],
    explained: bool = True,
) -> dict[str, Any]:
    """Train every family (and fold), then bag, ensemble, compare and publish (explained: with feature importance
    and report artifacts); every family's MLflow run ends as the run did."""
    k = parts.fold_count
    trained, built, status = None, None, "FAILED"
    try:
        run_config = train_config(config, parts.train_rows, k)
        reserve = refit_reserve(config, parts, runs)
        trained, failed, timed_out, share = train_families(config, prepared, runs, k, run_config, reserve)
        runs = {f: r for f, r in runs.items() if f not in failed and f not in timed_out}
        chosen = _chosen(config, parts, runs, trained, name, ingested.spec.fingerprint)
        outcomes, selections, decisions, built, fold_selections = chosen
        where = "the validation split" if k == 1 else f"the out-of-fold predictions ({k} folds)"
        candidates = compare(config, outcomes, selections, where) if len(runs) > 1 else None
        family = candidates.winner if candidates else next(iter(runs))
        outcome, selected = outcomes[family], selections[family]
        _leaderboard_costs(candidates, runs, trained, outcomes)
        earlier = _backtest_fit(config, run_config, parts, prepared, family, chosen, runs, share)
        refitted, refit_record = refit(config, run_config, parts, prepared, family, chosen, runs, name, share)
        time_budget = share.record()
        oof = {}
        if decisions is not None:  # the figures every choice read, under their own names
            oof = {"folds": k, "oof_metrics": oof_names(selected.metrics), "oof_rows": len(decisions.labels)}
            for row in candidates.scores if candidates else []:
                row.update(oof_names(selections[row["family"]].metrics))
        summary = publish(
            config,
            ingested,
            parts,
            refitted.outcome if refitted else outcome,
            refitted.selected if refitted else selected,
            {
                "candidates": candidates.scores if candidates else None,
                "validation": validation,
                "ensemble": built.record if built else None,
                "families_left_out": {**prepared.left_out, **timed_out} or None,
                "families_failed": failed or None,
                "warm_start": summary_record(prepared.warm),
                "recovered": recovered_families(trained) or None,
                "folds": k,
                "time_budget": {
                    **time_budget,
                    "cut_short": {
                        o.run_name: o.time_limited_at for o in trained.values() if o.time_limited_at is not None
                    },
                },
                **oof,
                **({"refit": refit_record} if refit_record else {}),
            },
            selections,
            decisions.scored(family) if decisions is not None else (refitted.raw if refitted else None),
            earlier,
            decisions.by_time(family) if decisions is not None else None,
            served_curves(family, k, trained, built),
            name,
            explained,
            source_plan(prepared.warm),
        )
        status = "FINISHED"
        return summary
    finally:  # every MLflow run of this retrain ends as the run did (a family's folds log into its one run)
        ended = status if not stop_requested() else "KILLED"
        if trained is None:  # stopped or failed while training: every run it may have opened, folds included
            for f, run in runs.items():
                end_runs(config, [run], f, ended)
        else:
            for f, run in {**runs, **({ENSEMBLE: built.outcome.run_name} if built else {})}.items():
                end_runs(config, [run], f, ended)


class _Chosen(NamedTuple):
    """What training gave the choice: each family's outcome and selected checkpoint (a bag of its folds when
    cross-fitted), the out-of-fold decisions (None with one split), the ensemble (None: none); fold_selections: each
    family's folds' selections."""

    outcomes: dict[str, TrainOutcome]
    selections: dict[str, Any]
    decisions: Any
    built: Any
    fold_selections: dict[str, list]


def _chosen(config: Config, parts: Split, runs: dict[str, str], trained, name: str, fingerprint: str) -> _Chosen:
    """Each family's best checkpoint (its folds bagged when cross-fitted) and the ensemble over them."""
    k = parts.fold_count
    decisions, fold_selections = None, {}
    fold_outcomes = {f: [trained[(f, i)] for i in range(k)] for f in runs}
    picked = select_each(fold_outcomes, config)  # every family's and fold's, in one task run
    if k > 1:  # each family's fold models: their out-of-fold predictions, and one bagged checkpoint serving them
        fold_selections = picked
        outcomes, selections, decisions = bag_folds(config, parts, runs, fold_outcomes, fold_selections, fingerprint)
    else:
        outcomes = {f: only for f, [only] in fold_outcomes.items()}
        selections = {f: only for f, [only] in picked.items()}
    built = None
    if ENSEMBLE in config.model.candidates:
        built = ensemble(config, parts.val, outcomes, selections, name, fingerprint, decisions, parts.plan)
        if built:
            outcomes[ENSEMBLE], selections[ENSEMBLE] = built.outcome, built.selected
            if decisions is not None:
                decisions = decisions.with_ensemble(ENSEMBLE, built.weights)
                built.outcome.budget["folds"] = k
    return _Chosen(outcomes, selections, decisions, built, fold_selections)


def _backtest_fit(
    config: Config,
    run_config: Config,
    parts: Split,
    prepared: Prepared,
    family: str,
    chosen: Any,
    runs: dict[str, str],
    share: TimeShare,
) -> Any:
    """Roles by time with test rows: the backtest's earlier model of the chosen family (an ensemble's heaviest
    member: flows/backtest.py), by the families' deadline; else None."""
    if parts.plan is None or parts.plan.time_column is None or not parts.test_rows:
        return None
    built = chosen.built
    member = backtest_family(family, built.weights if built and family == ENSEMBLE else None)
    recent = chosen.fold_selections[member][0] if parts.fold_count > 1 else chosen.selections[member]
    run = f"{runs[member]}-earlier"
    return fit_earlier(config, run_config, parts, prepared, member, recent.path, run, share.ends_at)


def _leaderboard_costs(candidates, runs: dict[str, str], trained, outcomes: dict[str, TrainOutcome]) -> None:
    """The leaderboard's cost column (a family's folds summed) and each family's resumes and recoveries."""
    for row in candidates.scores if candidates else []:
        row["train_s"] = (
            round(sum(o.train_s or 0.0 for (f, _), o in trained.items() if f == row["family"]), 1)
            if row["family"] in runs
            else outcomes[row["family"]].train_s  # the ensemble's own (its members' are theirs)
        )
        history = fit_history(row["family"], trained)
        row["resumed"], row["recoveries"] = history["resumed"], history["recoveries"]


def no_skill_loss(prep) -> float:
    """The validation loss of a model that learnt nothing: the class shares' log loss (their entropy), or for
    regression the standardized label's variance (1)."""
    if prep.task != "classification":
        return 1.0
    from scipy.stats import entropy

    counts = [c for c in prep.class_counts.values() if c > 0]
    return float(entropy(counts)) if counts else 0.0  # nats, the shares normalized from the counts


def _not_earning(
    family: str, first_fold: TrainOutcome, first_folds: dict[str, float], prepared: Prepared, k: int
) -> str | None:
    """Why family's remaining folds are not worth their time, measured on its first fold's validation rows (a fold of
    the non-test rows; never the test rows) against the other families' first folds (trainer/session.py not_earning);
    records its loss in first_folds."""
    mine = best_val_loss(first_fold.history)
    if mine is None:
        return None
    first_folds[family] = mine
    fold_rows = prepared.fold_rows[0] if prepared.fold_rows else 0  # the plan's count of the first fold's rows
    others = {f: v for f, v in first_folds.items() if f != family}
    return not_earning(mine, others, no_skill_loss(prepared.preprocessor), fold_rows, k)


def _train_in_shared_run(
    config: Config,
    prepared: Prepared,
    runs: dict[str, str],
    k: int,
    run_config: Config,
    retries: dict[str, Any],
    reserve: float,
) -> tuple[dict[tuple[str, int], TrainOutcome], dict[str, str], dict[str, str], TimeShare]:
    """train_families for a small table whose families share one Ray Train run (shares_a_run), in their training
    order, in one fit: every family's folds, or, where auto's "not earning" rule may leave a family out after its
    first fold, the first family's folds, every other family's first fold, then the other folds of those the rule
    keeps (the worker applies it: trainer/session.py FamiliesLoop). The time budget is shared as TimeShare shares it
    (FamiliesLoop)."""
    name = shared_run_name(runs)
    log = task_logger("retrain")
    share = TimeShare(config.train.time_limit, list(runs), 1, reserve=reserve)
    auto = {"started_at": share.started, "floor_s": AUTO_FLOOR_S} if share.limit == "auto" else None
    set_deadline(run_dir(config, name), share.ends_at, share.why)  # always: a killed run's old deadline never applies
    first = next(iter(runs))
    fold_rows = prepared.fold_rows[0] if prepared.fold_rows else 0
    rule = None
    if config.model.auto and fold_rows >= NOT_EARNING_MIN_ROWS:  # applied in the worker after every first fold
        rule = {
            "first": first,
            "first_fold": 0,
            "order": [(f, runs[f][len(name) + 1 :]) for f in runs],
            "base": no_skill_loss(prepared.preprocessor),
            "fold_rows": fold_rows,
            "k": k,
        }
    jobs = [(f, runs[f], list(range(k)), 0) for f in runs]
    label = f"train-{'-'.join(f for f in runs)}"
    outcomes, lost, left_out = (
        train_shared.with_options(task_run_name=label, **retries)
        .submit(prepared, run_config, name, jobs, auto, rule)
        .result()
    )
    trained: dict[tuple[str, int], TrainOutcome] = {}
    failed: dict[str, str] = {}
    timed_out: dict[str, str] = {}
    for f, why in lost.items():
        failed[f] = redact_text(f"{runs[f]} failed: {why}")[:2000]
        log.warning("%s is left out, the other families go on: %s", f, failed[f])
        end_runs(config, [runs[f]], f, "FAILED")
    for f, got in outcomes.items():
        trained.update({(f, fold): o for fold, o in zip(range(k), got)})
        if f in left_out:  # the worker's not-earning rule (trainer/session.py), after its first fold
            timed_out[f] = left_out[f]
        elif 0 in [o.time_limited_at for o in got] and f != first:  # one step: no model worth its time
            unit = got[0].budget.get("unit", "epoch")
            timed_out[f] = f"{share.why}: its run {runs[f]} had time for its first {unit} only"
        if f in timed_out:
            log.warning("%s is left out: %s", f, timed_out[f])
    if auto:  # the rule the worker applied once the first family had trained (trainer/session.py)
        entry = deadline_entry(run_dir(config, name))
        if entry and entry[1]:
            share.ends_at, share.why = entry
    if len(failed) == len(runs) or (first in failed and all(f in failed or f in timed_out for f in runs)):
        raise TrainingError(f"every family failed in the shared run {name}: " + "; ".join(failed.values()))
    return _kept(config, runs, trained, failed, timed_out), failed, timed_out, share


def _kept(
    config: Config,
    runs: dict[str, str],
    trained: dict[tuple[str, int], TrainOutcome],
    failed: dict[str, str],
    timed_out: dict[str, str],
) -> dict[tuple[str, int], TrainOutcome]:
    """The outcomes of the families neither failed nor left out by time; the MLflow runs of those the time left out
    after they had started end KILLED."""
    for family in timed_out:
        if any(job[0] == family for job in trained):  # runs it had started end unused
            end_runs(config, [runs[family]], family, "KILLED")
    dropped = {**failed, **timed_out}
    return {job: out for job, out in trained.items() if job[0] not in dropped}


def served_curves(family: str, k: int, trained: dict[tuple[str, int], TrainOutcome], built) -> list[dict[str, Any]]:
    """The training histories of every model the served one is made of (tasks/report.py training_curves): the
    family's run, or each of its fold models; for an ensemble, those of each member with weight, in one panel each."""
    members = (
        [(m["family"], m["weight"]) for m in built.record["members"] if m["weight"] > 0]
        if family == ENSEMBLE and built
        else [(family, None)]
    )
    return [
        {
            "family": f,
            "panel": f if weight is None else f"{f}, weight {weight:.2f} in the ensemble",
            "label": f"fold {i}" if k > 1 else f,
            "history": trained[(f, i)].history,
            "unit": trained[(f, i)].budget.get("unit", "epoch"),
        }
        for f, weight in members
        for i in range(k)
        if (f, i) in trained
    ]


SHARED_ROWS = 4_000  # at most this many non-test rows: where Ray Train's start is most of a family's fit


def shares_a_run(config: Config, prepared: Prepared, runs: dict[str, str], k: int, train_rows: int) -> bool:
    """Whether a retrain's families train in one Ray Train run, one after another in one worker (trainer/session.py
    FamiliesLoop): several families, every one a one-CPU-worker fit (config: tasks/cross_fit.py train_config's), and
    a small table: cross-fitted, at most SHARED_ROWS non-test rows; one split, at most ONE_WORKER_ROWS training rows
    held in memory and no warm start. Ray Train's start, about 10 s each, is then most of their time: a 150-row
    table's 4 families trained 5 folds each in 3-5 s after 27 s of start each, a 15,000-row table's 4 families
    under 2 s each after 11-14 s of start each."""
    small = (
        sum(prepared.fold_rows) <= SHARED_ROWS
        if k > 1
        else train_rows <= ONE_WORKER_ROWS and prepared.materialized and not any(map(prepared.warm_start_for, runs))
    )
    return (
        small
        and len(runs) > 1
        and not any(prepared.budgets[f].external_memory for f in runs)
        and shared_scaling({f: config.for_family(f) for f in runs}) is not None
    )


def fold_groups(config: Config, family: str, first: str, families: int, k: int, fold_rows: int) -> list[list[int]]:
    """The Ray Train runs a family's folds train in, one after another (trainer/session.py): all of them in one run,
    except where auto's "not earning" rule may leave it out after its first fold (several families, enough rows in a
    fold to tell, not the first family): then its first fold alone, and the others in a second fit of the same run."""
    if k == 1:
        return [[0]]
    if config.model.auto and families > 1 and family != first and fold_rows >= NOT_EARNING_MIN_ROWS:
        return [[0], list(range(1, k))]
    return [list(range(k))]


def train_families(
    config: Config, prepared: Prepared, runs: dict[str, str], k: int, run_config: Config, reserve: float = 0.0
) -> tuple[dict[tuple[str, int], TrainOutcome], dict[str, str], dict[str, str], TimeShare]:
    """Every family's runs, as many at once as the cluster holds worker groups, the next starting as soon as one
    ends, each with its share of train.time_limit (trainer/deadline.py): ({(family, fold): outcome},
    {family: why it failed}, {family: why the time limit or its first fold left it out (auto)}, the time budget
    (its record for the summary). Cross-fitted, a family's folds train one after another inside one Ray Train run
    (fold_groups). reserve: the share of a time limit in seconds kept for train.refit. With several families, one that fails after its retries (a dead worker group, a diverging loss,
    memory) is left out with the reason and the others go on; a bad config or table, a stop request, or the failure
    of every family fails the run."""
    retries = {"retries": config.failure.task_retries, "retry_delay_seconds": config.failure.retry_delay_s}
    if shared_run_name(runs):
        return _train_in_shared_run(config, prepared, runs, k, run_config, retries, reserve)
    fits = _FamilyRuns(config, prepared, runs, k, run_config, retries, reserve)
    while fits.jobs or fits.running:
        fits.start_ready()
        done = wait(list(fits.running.values()), timeout=1.0).done
        for job, future in [(job, fut) for job, fut in fits.running.items() if fut in done]:
            del fits.running[job]
            fits.ended(*job, future)
    if len(fits.failed) == len(runs):
        raise fits.errors[0]
    kept = _kept(config, runs, fits.trained, fits.failed, fits.timed_out)
    if fits.errors and not kept:  # the first family failed, the time left out the rest
        raise fits.errors[0]
    return kept, fits.failed, fits.timed_out, fits.share


class _FamilyRuns:
    """train_families' state: the runs (family, folds) waiting and running, and what each ended with."""

    def __init__(
        self, config: Config, prepared: Prepared, runs: dict[str, str], k: int, run_config, retries, reserve: float
    ) -> None:
        self.config, self.prepared, self.runs, self.k, self.run_config = config, prepared, runs, k, run_config
        self.trainer, self.fold_trainer = train.with_options(**retries), train_folds.with_options(**retries)
        self.first = next(iter(runs))
        fold_rows = prepared.fold_rows[0] if prepared.fold_rows else 0
        self.jobs = [(f, tuple(g)) for f in runs for g in fold_groups(config, f, self.first, len(runs), k, fold_rows)]
        self.at_once = concurrent_runs(run_config.scaling.model_dump())
        # a family's folds train one after another: each its part of the family's time (TimeShare's waves of one)
        self.share = TimeShare(config.train.time_limit, list(runs), 1 if k > 1 else self.at_once, reserve=reserve)
        self.trained: dict[tuple[str, int], TrainOutcome] = {}
        self.failed: dict[str, str] = {}
        self.timed_out: dict[str, str] = {}
        self.errors: list[BaseException] = []
        self.running: dict[tuple[str, tuple[int, ...]], Any] = {}
        self.started: set[str] = set()
        self.first_folds: dict[str, float] = {}  # auto, cross-fitted: each family's first fold's best validation loss

    def folder(self, family: str) -> str:
        return run_dir(self.config.for_family(family), self.runs[family])

    def leave_out(self, family: str, why: str) -> None:
        self.timed_out[family] = why
        task_logger("retrain").warning("%s is left out: %s", family, why)
        self.jobs = [j for j in self.jobs if j[0] != family]

    def start_ready(self) -> None:
        """Runs started while the cluster holds more worker groups (a family's runs one after another)."""
        share, k = self.share, self.k
        while len(self.running) < self.at_once:
            ready = [j for j in self.jobs if all(r[0] != j[0] for r in self.running)]
            if not ready:
                return
            f, group = ready[0]
            why = None if f in self.started else share.too_late(f, k)
            if why:  # a family starts all of its folds or none: its fold models are of no use one short
                self.leave_out(f, why)
                continue
            self.started.add(f)
            self.jobs.remove((f, group))
            left = sum(len(g) for j, g in self.jobs if j == f) + len(group)  # its folds not trained yet, these included
            ends_at = share.run_deadline(left)
            if ends_at is not None:  # a family that started finishes its folds, each with at least a short run
                ends_at = time.time() + max(ends_at - time.time(), MIN_RUN_S) * len(group)
            set_deadline(self.folder(f), ends_at, share.why)  # always: a killed run's old deadline never applies
            if ends_at is not None:
                task_logger("retrain").info(
                    "%s: its share of the time budget ends in %.0f s (%s)",
                    self.runs[f],
                    ends_at - time.time(),
                    share.why,
                )
            label = f"train-{f}" + (f"-folds{group[0]}-{group[-1]}" if k > 1 else "")
            args = (self.prepared, self.run_config, self.runs[f], f)
            self.running[(f, group)] = (
                self.fold_trainer.with_options(task_run_name=label).submit(*args, list(group))
                if k > 1
                else self.trainer.with_options(task_run_name=label).submit(*args)
            )

    def ended(self, family: str, group: tuple[int, ...], future) -> None:
        """A run that ended: its outcomes kept (and the time's and auto's rules applied), or its family left out."""
        future.wait()  # done: this only records its final state on the future (else .state asks the API)
        if not future.state.is_failed() or len(self.runs) == 1:
            result = future.result()  # raises a crash, a cancel, and the only family's failure
            self._trained(family, group, result if self.k > 1 else [result])
        else:
            self._failed(family, future.result(raise_on_failure=False))
        if all(j[0] != self.first for j in [*self.jobs, *self.running]) and self.share.first_family_ended():
            task_logger("retrain").info("time budget: %s", self.share.why)
            for f, _ in self.running:  # the runs already training get the new deadline too
                set_deadline(self.folder(f), self.share.ends_at, self.share.why)

    def _trained(self, family: str, group: tuple[int, ...], outcomes: list[TrainOutcome]) -> None:
        for fold, outcome in zip(group, outcomes):
            self.trained[(family, fold)] = outcome
        others_waiting = any(j[0] == family for j in self.jobs)
        cut = [self.trained[(family, i)].time_limited_at for i in group]
        if 0 in cut and family != self.first and family not in self.timed_out:  # one step: no model worth its time
            unit = self.trained[(family, group[0])].budget.get("unit", "epoch")
            self.leave_out(
                family,
                f"{self.share.why}: its run {self.runs[family]} had time for its first {unit} only"
                + ("; its other folds were not started" if others_waiting else ""),
            )
        first_fold = group[0] == 0 and family not in self.timed_out
        if self.config.model.auto and self.k > 1 and len(self.runs) > 1 and first_fold:
            why = _not_earning(family, self.trained[(family, 0)], self.first_folds, self.prepared, self.k)
            if why and any(j[0] == family for j in self.jobs):  # its other folds would cost time for nothing
                self.leave_out(family, why)

    def _failed(self, family: str, exc: BaseException) -> None:
        if isinstance(exc, (ConfigError, DataError)) or stop_requested(exc) or disk_full(exc):
            raise exc
        self.errors.append(exc)
        self.failed[family] = redact_text(
            f"{self.runs[family]} failed (Prefect retries: {self.config.failure.task_retries}): "
            f"{type(exc).__name__}: {exc}"
        )[:2000]
        task_logger("retrain").warning("%s is left out, the other families go on: %s", family, self.failed[family])
        end_runs(self.config, [self.runs[family]], family, "FAILED")
        self.jobs = [j for j in self.jobs if j[0] != family]  # a family's other folds are of no use without this one
