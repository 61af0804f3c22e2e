"""Refit (train.refit): once the family, its rounds and the ensemble weights are chosen, the chosen boosters train once
more on every row that may train (every non-test row when cross-fitted; training plus validation rows on one split),
for as many rounds as their chosen models stopped at, scaled by the rows they gain, without early stopping; the
refitted model is what is scored on the test rows, registered and gated.

What stays as it was chosen: the family (or the ensemble and its weights), the rounds (the mean of the fold models'
best rounds, or the one split's, times the rows' ratio: more rows, more rounds), a family's own choices that depend on
the rows (CatBoost's learning rate, which it otherwise picks from the rows and the rounds: Family.refit_params), and
the calibration and threshold (fitted on the rows that chose: the out-of-fold outputs, or the chosen model's
validation outputs). A refit has no rows of its own to be judged on before the test rows, so its figures before them
are the chosen model's (the summary's `metrics`), and the summary's `refit` gives both models' test figures. Only the
boosters refit (their size is a count of rounds; one network in place of the fold models' average lost where measured:
docs/families.md#refit); in an ensemble its other members serve as chosen. Measured (docs/families.md#refit):
regression gains on every booster, classification level for XGBoost and LightGBM and a gain for CatBoost with its
fold models' learning rate (a loss with its own).

A refit is a run like any other (tasks/train.py), <family's run>/refit; where the families shared one run
(<name>-families), an ensemble's members refit in one run of their own, <name>-families/refit, each in its folder
(train_shared: Ray Train's start paid once). A rerun of the run name finds them finished or resumes them. It is
skipped, with the reason, where there are no test rows (nothing could judge it), where the chosen model was
warm-started (it continues its source's rounds), where the time budget has too little left, where its fit
fails or the time budget cuts it short (a refit short of its rounds would serve a worse model).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from trainflow.config import ENSEMBLE, Config
from trainflow.flows.backtest import extra_fit, extra_fits
from trainflow.preprocessors.fit import pack
from trainflow.run.storage import private_copy
from trainflow.tasks.common import lineage_for, task_logger
from trainflow.tasks.train import shared_run_name
from trainflow.tasks.values import Prepared, Selected, Split, TrainOutcome
from trainflow.trainer.ensemble import ensemble_dir, write_ensemble
from trainflow.trainer.evaluate import Scored, score_checkpoint
from trainflow.trainer.families import family_named
from trainflow.trainer.runner import shared_scaling
from trainflow.trainer.serving.servable import load_servable

REFIT_FOLDER = "refit"  # <a family's run>/refit: its refit's run, inside the family's (as its folds' are)
# a time limit in seconds: the part the families leave for the refit (measured: a booster's refit takes about the
# rows' ratio over K of its folds' time, and the boosters ran first; the networks after them lose this much)
REFIT_RESERVE = 0.1
MIN_REFIT_S = 2.0  # less time left than this: no refit (a small table's refits train in this process in under 1 s)
REFITTED = ", refitted"  # the refitted model's name beside the chosen one's in the test figures ("xgboost, refitted")


@dataclass
class Refitted:
    """What a refit gives publish: the served outcome and checkpoint, and the chosen model's outputs its calibration
    is fitted on."""

    outcome: TrainOutcome
    selected: Selected
    raw: Scored | None


def refit_reserve(config: Config, parts: Split, runs: dict[str, str]) -> float:
    """The share of a time limit in seconds the families leave for the refit: REFIT_RESERVE where one may follow
    (train.refit auto, test rows to judge it, a family that refits), else 0."""
    may = config.train.refit == "auto" and parts.test_rows > 0 and any(family_named(f).refits for f in runs)
    return REFIT_RESERVE if may and isinstance(config.train.time_limit, (int, float)) else 0.0


def refit_members(family: str, weights: dict[str, float] | None, prepared: Prepared) -> list[str]:
    """The members a refit trains again: the chosen family, or an ensemble's members with weight, that refit
    (Family.refits) and read their rows into memory (an external-memory booster's table is too big to fit twice)."""
    members = list(weights or {}) if family == ENSEMBLE else [family]
    return [
        m
        for m in members
        if family_named(m).refits and m in prepared.budgets and not prepared.budgets[m].external_memory
    ]


def _rows(parts: Split, fold_rows: list[int]) -> tuple[Any, Any, int, float]:
    """(every row that may train, rows its fit reports on (rows it trains on too), their count, how many times the
    rows each chosen model trained on)."""
    if parts.fold_count > 1:  # every fold model trained on the non-test rows less its fold
        trained = float(np.mean([parts.train_rows - rows for rows in fold_rows]))
        return parts.train, parts.folds[0][1], parts.train_rows, parts.train_rows / max(1.0, trained)
    rows = parts.train_rows + parts.val_rows
    if isinstance(parts.train, pa.Table):
        both = pa.concat_tables([parts.train, parts.val])
    else:
        both = parts.train.union(parts.val)
    return both, parts.val, rows, rows / max(1, parts.train_rows)


def refit(
    config: Config,
    run_config: Config,
    parts: Split,
    prepared: Prepared,
    family: str,
    chosen: Any,
    runs: dict[str, str],
    name: str,
    share: Any,
) -> tuple[Refitted | None, dict[str, Any] | None]:
    """Refit the chosen family (or ensemble) under train.refit: chosen, what training gave the choice
    (flows/retrain.py _Chosen: each family's outcome and served checkpoint, its fold models' selections, the
    ensemble); runs: each family's run; name: the retrain's; share: the time budget (the refit ends with its limit,
    what it kept included). (the refit or None, the summary's record: `refitted`, and what was refitted or why
    nothing was; None where train.refit is off)."""
    outcome, selected = chosen.outcomes[family], chosen.selections[family]
    k = parts.fold_count
    members = chosen.fold_selections if k > 1 else {f: [s] for f, s in chosen.selections.items()}
    weights = chosen.built.weights if chosen.built and family == ENSEMBLE else None
    bags, ends_at = chosen.selections, share.limit_ends_at
    if config.train.refit == "off":
        return None, None
    log = task_logger("refit")
    refitting = refit_members(family, weights, prepared)
    why = None
    if not refitting:
        why = f"{family} has no member that refits (the boosters do: their size is a count of rounds)"
    elif any(prepared.warm_start_for(m) for m in refitting):
        why = "train.warm_start: the chosen model continues its source's rounds, which a refit from nothing would not"
    elif parts.test is None or not parts.test_rows:
        why = "no test rows: nothing could judge a refitted model"
    elif ends_at is not None and ends_at - time.time() < MIN_REFIT_S:
        why = f"the time budget had {max(0.0, ends_at - time.time()):.0f} s left (train.time_limit)"
    if why:
        log.info("refit: none: %s", why)
        return None, {"refitted": False, "why": why}
    train_rows, report_rows, rows, ratio = _rows(parts, prepared.fold_rows)
    packed = pack(train_rows, report_rows, prepared.preprocessor, prepared.materialized)
    mine = replace(prepared, train=packed[0], val=packed[1], folds=None, fold_rows=[], warm=None, rows=rows)
    plans = {m: _plan(run_config, mine, m, members[m], ratio) for m in refitting}
    home = shared_run_name(runs)
    if home and len(plans) > 1 and shared_scaling({m: plan[0] for m, plan in plans.items()}):
        fits = _in_one_run(config, mine, plans, runs, f"{home}/{REFIT_FOLDER}", ends_at)
    else:
        fits = _each(config, mine, plans, runs, ends_at)
    fitted: dict[str, Selected] = {}
    lines: list[dict[str, Any]] = []
    for member, got, run_name in fits:  # until one does not serve (_each fits no member after it)
        why = _short(got, run_name, plans[member][2]["rounds"])
        if why:
            log.warning("refit: none: %s", why)
            return None, {"refitted": False, "why": why, "members": lines}
        fitted[member] = got[1]
        lines.append({**plans[member][2], "run": run_name})
    # the chosen model's outputs on the rows that chose it: its calibration's rows (cross-fitted: the caller's)
    raw = None
    if parts.fold_count == 1:
        raw = score_checkpoint(selected.path, parts.val, tuple(config.promotion.slices), calibrated=False)
    record = {"refitted": True, "rows": rows, "members": lines, "from": selected.uri or selected.path}
    if family != ENSEMBLE:
        [(member, refitted)] = fitted.items()
        served = replace(refitted, metrics=selected.metrics)  # its figures before the test rows: the chosen model's
        served_outcome = _outcome(outcome, served)
    else:
        served_outcome, served = _ensemble(config, prepared, outcome, selected, weights, bags, fitted, name)
    record["checkpoint"] = served.uri or served.path
    log.info(
        "refit: %s trained again on %d rows (%s); it is the model scored on the test rows and registered",
        family,
        rows,
        ", ".join(f"{line['family']} {line['rounds']} rounds" for line in lines),
    )
    return Refitted(served_outcome, served, raw), record


def _plan(run_config: Config, prepared: Prepared, member: str, chosen: list[Selected], ratio: float):
    """A member's refit: (its config: its rounds fixed, early stopping off, its pinned values; its budget; its summary
    line). chosen: its chosen models' selections (its fold models', or the one split's); ratio: how many times the
    rows each trained on the refit has."""
    family = family_named(member)
    best = [s.epoch + 1 for s in chosen]  # a booster's epoch is its best round's number, from 0
    rounds = max(1, int(round(float(np.mean(best)) * ratio)))
    pinned = family.refit_params([Path(s.path) for s in chosen]) if family.refit_params else {}
    member_config = family.refit_config(run_config.for_family(member), rounds, pinned)
    budget = family.budget(member_config, prepared.rows, member_config.scaling.max_workers)
    return member_config, budget, {"family": member, "rounds": rounds, "chosen_rounds": best, **pinned}


Fit = tuple[str, tuple[TrainOutcome, Selected] | str, str]  # (member, its fit or why there is none, its run)


def _each(
    config: Config, prepared: Prepared, plans: dict[str, Any], runs: dict[str, str], ends_at: float | None
) -> Iterator[Fit]:
    """Each member's refit in a run of its own, <its family's run>/refit (a member that trains in a worker group of its
    own, or the one member), fitted as it is asked for."""
    for member, (member_config, budget, _) in plans.items():
        run_name = f"{runs[member]}/{REFIT_FOLDER}"
        mine = replace(prepared, budgets={member: budget})
        yield (
            member,
            extra_fit(config, member_config, mine, member, run_name, f"refit-{member}", ends_at, latest=True),
            run_name,
        )


def _in_one_run(
    config: Config,
    prepared: Prepared,
    plans: dict[str, Any],
    runs: dict[str, str],
    run_name: str,
    ends_at: float | None,
) -> Iterator[Fit]:
    """The members' refits one after another in one Ray Train run run_name (<name>-families/refit: the families
    trained in one run, each in one worker), each in its folder <run_name>/<its family's run>: Ray Train's start paid
    once (a refit per run cost 7-10 s of start each for 1-2 s of fitting at 150,000 rows)."""
    mine = replace(prepared, budgets={m: plan[1] for m, plan in plans.items()})
    own = {m: f"{run_name}/{runs[m].rsplit('/', 1)[-1]}" for m in plans}
    configs = {m: plan[0] for m, plan in plans.items()}
    got = extra_fits(config, configs, mine, run_name, own, f"refit-{'-'.join(plans)}", ends_at, latest=True)
    for member in plans:
        yield member, got if isinstance(got, str) else got[member], own[member]


def _short(got: tuple[TrainOutcome, Selected] | str, run_name: str, rounds: int) -> str | None:
    """Why a member's refit does not serve (its fit failed, or the time budget cut it short of its rounds), or None."""
    if isinstance(got, str):
        return got
    if got[0].time_limited_at is not None:
        return (
            f"the refit {run_name} was cut short by the time budget after round {got[0].time_limited_at} of "
            f"{rounds}: the chosen model serves"
        )
    return None


def _outcome(chosen: TrainOutcome, refitted: Selected) -> TrainOutcome:
    """The served outcome of a one-family refit: the chosen one's record (its run, its folds, its history; the
    registered version's MLflow run is the family's), its checkpoint the refit's."""
    return replace(
        chosen,
        checkpoints=[{"path": refitted.uri or refitted.path, "epoch": refitted.epoch, "metrics": refitted.metrics}],
        budget={**chosen.budget, "refit": True},
    )


def _ensemble(
    config: Config,
    prepared: Prepared,
    outcome: TrainOutcome,
    selected: Selected,
    weights: dict[str, float] | None,
    bags: dict[str, Selected],
    fitted: dict[str, Selected],
    name: str,
) -> tuple[TrainOutcome, Selected]:
    """The ensemble with its refitted members (the others as chosen), its weights as chosen."""
    kept = dict(weights or {})
    members = {f: (fitted[f] if f in fitted else bags[f]).path for f in kept}
    sources = {f: (fitted[f] if f in fitted else bags[f]).uri or members[f] for f in kept}
    target = ensemble_dir(config.storage_path, name, kept, sources)  # beside the chosen one: its sources differ
    local = private_copy(
        write_ensemble(
            target,
            members,
            kept,
            selected.metrics,
            prepared.preprocessor.to_dict(),
            config.to_dict(),
            lineage_for(config, prepared.fingerprint, ENSEMBLE),
        )
    )
    load_servable(local)
    served = Selected(path=local, epoch=0, metrics=selected.metrics, skipped=[], uri=target)
    description = ", ".join(f"{f} {w:.2f}" + (" (refitted)" if f in fitted else "") for f, w in kept.items())
    return (
        replace(
            outcome,
            checkpoints=[{"path": target, "epoch": 0, "metrics": selected.metrics}],
            budget={**outcome.budget, "description": f"the members weighted {description}", "refit": True},
        ),
        served,
    )
