"""Task: with several model families in one run, a weighted ensemble of their best checkpoints, a candidate beside
them (model.ensemble)."""

from __future__ import annotations

import time

from dataclasses import dataclass
from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.data import Rows
from trainflow.roles.folds import FoldPlan
from trainflow.config import ENSEMBLE, Config
from trainflow.run.storage import private_copy
from trainflow.tasks.values import Decisions, Selected, TrainOutcome
from trainflow.tasks.common import lineage_for
from trainflow.trainer.ensemble import (
    ROUNDS,
    cross_fitted,
    halves,
    ensemble_dir,
    greedy_weights,
    member_outputs,
    write_ensemble,
)
from trainflow.trainer.metrics import compute_metrics
from trainflow.trainer.serving.servable import combine, load_servable


@dataclass
class Built:
    outcome: TrainOutcome
    selected: Selected
    record: dict[str, Any]  # the summary's `ensemble`: members with weights and scores, how it was scored
    weights: dict[str, float]  # the members kept, by family


def _halves(keys, labels: np.ndarray) -> np.ndarray:
    """The two halves the ensemble's score is cross-fitted over: the fold plan's (trainer/ensemble.py halves); rows
    without a plan (a table split elsewhere) alternate."""
    return halves(keys) if keys is not None else (np.arange(len(labels)) % 2).astype(np.int8)


def _member_outputs(holdout, selections: dict[str, Selected], decisions, plan) -> tuple:
    """(the preprocessor, each family's outputs, the labels, the rows' keys) the weights are fitted on: the
    validation split scored by each selected checkpoint, or the out-of-fold outputs (decisions)."""
    if decisions is not None:
        outputs = {f: decisions.outputs[f] for f in selections}
        return decisions.prep, outputs, decisions.labels, decisions.keys
    servables = {f: load_servable(s.path, calibrated=False) for f, s in selections.items()}
    prep = next(iter(servables.values())).preprocessor
    outputs, labels, _, keys = member_outputs({f: s.predict for f, s in servables.items()}, prep, holdout, plan=plan)
    return prep, outputs, labels, keys


def _member(family: str, kept: dict[str, float], selected: Selected, metric: str, rows_are: str) -> dict[str, Any]:
    """A family's line in the ensemble's record: its weight, its score, its checkpoint, why it was left out."""
    why = f"greedy selection on {rows_are} gave it weight 0: adding it never lowered the ensemble's loss"
    return {
        "family": family,
        "weight": kept.get(family, 0.0),
        metric: selected.metrics.get(metric),
        "checkpoint": selected.uri or selected.path,
        **({} if family in kept else {"left_out": why}),
    }


@task(name="ensemble", cache_policy=NO_CACHE)
def ensemble(
    config: Config,
    holdout: Rows | None,
    outcomes: dict[str, TrainOutcome],
    selections: dict[str, Selected],
    run_name: str,
    fingerprint: str,
    decisions: Decisions | None = None,
    plan: FoldPlan | None = None,
) -> Built | None:
    """Greedy ensemble selection over the families' selected checkpoints on the validation split (or, with
    cross-fitting, on their out-of-fold outputs: decisions); None when it keeps a single member (that family is
    already a candidate). The ensemble's metrics are cross-fitted (each half of the rows, the fold plan's halves:
    by hash, or by time the newer and the older, scored with weights fitted on the other half), so it competes with
    the members on equal terms."""
    log, started = get_run_logger(), time.monotonic()
    prep, outputs, labels, keys = _member_outputs(holdout, selections, decisions, plan)
    rows_are = "the validation split" if decisions is None else "the out-of-fold predictions"
    families = list(outputs)
    weights = greedy_weights(prep.task, [outputs[f] for f in families], labels)
    kept = {f: w for f, w in zip(families, weights) if w > 0}
    metric = config.promotion.metric
    if len(kept) < 2:
        log.info("ensemble: greedy selection on %s kept %s alone; no ensemble candidate", rows_are, list(kept))
        return None
    crossed = compute_metrics(
        prep.task, cross_fitted(prep.task, [outputs[f] for f in families], labels, _halves(keys, labels)), labels, prep
    )
    in_sample = compute_metrics(
        prep.task, combine(prep.task, [outputs[f] for f in kept], list(kept.values())), labels, prep
    )
    members = {f: selections[f].path for f in kept}
    sources = {f: selections[f].uri or selections[f].path for f in kept}
    target = ensemble_dir(config.storage_path, run_name, kept, sources)
    local = private_copy(
        write_ensemble(
            target, members, kept, crossed, prep.to_dict(), config.to_dict(), lineage_for(config, fingerprint, ENSEMBLE)
        )
    )  # checked here, read after
    load_servable(local)  # proven loadable, as select proves a family's checkpoint
    record = {
        "weighted_on": "out-of-fold" if decisions is not None else "validation",
        "members": [_member(f, kept, selections[f], metric, rows_are) for f in families],
        "rounds": ROUNDS,
        "cross_fitted": crossed,
        "in_sample": in_sample,
        "rows": int(len(labels)),
    }
    described = ", ".join(f"{f} {w:.2f}" for f, w in kept.items())
    log.info(
        "ensemble: weights %s; cross-fitted %s = %.5g (fitted on all rows: %.5g)",
        described,
        metric,
        crossed.get(metric, np.nan),
        in_sample.get(metric, np.nan),
    )
    outcome = TrainOutcome(
        run_name=f"{run_name}-{ENSEMBLE}",
        family=ENSEMBLE,
        run_path=target.rsplit("/", 1)[0],
        checkpoints=[{"path": target, "epoch": 0, "metrics": crossed}],
        history=[],
        budget={
            "description": f"no training of its own: the members' best checkpoints weighted {described}",
            "weights": kept,
        },
        train_s=round(time.monotonic() - started, 1),  # its own time: the weights, the bundle, the load check
    )
    return Built(outcome, Selected(path=local, epoch=0, metrics=crossed, skipped=[], uri=target), record, kept)
