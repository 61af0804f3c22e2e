"""Task: cross-fitting's last step. Each family's fold models predict the fold each never trained on (out-of-fold
predictions, the rows in one order for every family), and become one bagged checkpoint that serves their average.

The out-of-fold outputs are the rows every later choice reads (the family comparison, the ensemble weights,
calibration and the threshold): no choice reads rows the model it judges trained on, and no test row is read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pyarrow as pa
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.config import Config
from trainflow.roles.folds import AUTO_FOLD_ROWS, ONE_WORKER_ROWS
from trainflow.run.storage import join, private_copy
from trainflow.tasks.common import retry_unless_user_error, lineage_for
from trainflow.trainer.session import fold_folder
from trainflow.tasks.values import Selected, Split, TrainOutcome, Decisions
from trainflow.trainer.serving.checkpoint import read_config
from trainflow.trainer.ensemble import member_outputs, write_bundle
from trainflow.trainer.metrics import compute_metrics
from trainflow.trainer.serving.servable import BAG_FILE, fold_dir, load_servable


def fold_run_names(runs: dict[str, str], folds: int) -> dict[str, list[str]]:
    """Each family's fold folders inside its run (<family's run>/fold<k>: trainer/session.py), each holding its fold's
    checkpoints, as run names under storage_path."""
    return {family: [f"{run}/{fold_folder(k)}" for k in range(folds)] for family, run in runs.items()}


def fold_config(config: Config, fit_rows: int) -> Config:
    """The config fold models train with: on a small table (at most AUTO_FOLD_ROWS rows to cross-fit) one worker
    each, so that several families train side by side (a few thousand rows gain nothing from data-parallel
    training); else the configured scaling."""
    workers = min(config.scaling.min_workers, 1) if fit_rows <= AUTO_FOLD_ROWS else config.scaling.num_workers
    return config.model_copy(update={"scaling": config.scaling.model_copy(update={"num_workers": workers})})


def train_config(config: Config, fit_rows: int, folds: int) -> Config:
    """The config a retrain's families train with: cross-fitted, fold_config's; one split of at most ONE_WORKER_ROWS
    training rows with scaling.num_workers left unset, one worker per family (its batch, epochs and schedule those of
    one worker: trainer/budget.py; flows/retrain.py sizes the families so), so that the families can share one Ray
    Train run (flows/retrain.py shares_a_run); else the config as it is. The worker keeps one worker's CPUs: two runs at once
    on a small machine still train side by side (giving it both planned workers' CPUs measured no faster at 80,000
    rows, docs/performance.md)."""
    if folds > 1:
        return fold_config(config, fit_rows)
    if fit_rows > ONE_WORKER_ROWS or "num_workers" in config.scaling.model_fields_set:
        return config
    return config.model_copy(update={"scaling": config.scaling.model_copy(update={"num_workers": 1})})


def oof_names(metrics: dict[str, Any]) -> dict[str, float]:
    """val_loss -> oof_loss, ...: the same metric over the out-of-fold predictions."""
    return {
        ("oof_" + k[4:] if k.startswith("val_") else k): float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float))
    }


def bag_dir(storage_path: str, run_name: str, sources: list[str]) -> str:
    """Where a family's bag lives: <storage>/<its run>-bag/bag_<digest of its fold checkpoints>, so a rerun over the
    same fold checkpoints finds the one it wrote."""
    digest = hashlib.blake2b(json.dumps(sources).encode(), digest_size=8).hexdigest()
    return join(storage_path, f"{run_name}-bag", f"bag_{digest}")


def out_of_fold(parts: Split, selections: dict[str, list[Selected]]) -> Decisions:
    """Every family's out-of-fold outputs: fold k's held-out rows through fold model k, one pass per fold for all
    families (with the rows' times by time, and their hash keys)."""
    families = list(selections)
    servables = {f: [load_servable(s.path, calibrated=False) for s in selections[f]] for f in families}
    prep = servables[families[0]][0].preprocessor
    pieces: dict[str, list[np.ndarray]] = {f: [] for f in families}
    labels, times, keys = [], [], []
    keep = (parts.plan.time_column,) if parts.plan is not None and parts.plan.time_column is not None else ()
    for k, (_, held) in enumerate(parts.folds):
        predictors = {f: servables[f][k].predict for f in families}
        outs, y, kept, u = member_outputs(predictors, prep, held, keep=keep, plan=parts.plan)
        for f in families:
            pieces[f].append(outs[f])
        labels.append(y)
        times.extend(c for column in kept.values() for c in column.chunks)
        keys.extend([u] if u is not None else [])
    return Decisions(
        prep,
        {f: np.concatenate(p) for f, p in pieces.items()},
        np.concatenate(labels),
        {keep[0]: pa.chunked_array(times, type=times[0].type)} if keep and times else {},
        np.concatenate(keys) if keys else None,
    )


@task(
    name="out-of-fold",
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def bag_folds(
    config: Config,
    parts: Split,
    runs: dict[str, str],
    outcomes: dict[str, list[TrainOutcome]],
    selections: dict[str, list[Selected]],
    fingerprint: str,
) -> tuple[dict[str, TrainOutcome], dict[str, Selected], Decisions]:
    """Every family's out-of-fold outputs (fold k's held-out rows through fold model k, one pass per fold for all
    families) and its bagged checkpoint, scored by them: (outcomes, selections, decisions) per family."""
    log = get_run_logger()
    families = list(selections)
    decisions = out_of_fold(parts, selections)
    prep = decisions.prep
    bagged_outcomes, bagged = {}, {}
    for f in families:
        metrics = compute_metrics(prep.task, decisions.outputs[f], decisions.labels, prep)
        folds, chosen = outcomes[f], selections[f]
        sources = [s.uri or s.path for s in chosen]
        target = bag_dir(config.storage_path, runs[f], sources)
        written = write_bundle(
            target,
            {fold_dir("", k): s.path for k, s in enumerate(chosen)},
            BAG_FILE,
            json.dumps({"folds": len(chosen), "fold_checkpoints": sources}, indent=1),
            metrics,
            prep.to_dict(),
            read_config(chosen[0].path),
            lineage_for(config, fingerprint, f),
        )
        local = private_copy(written)  # checked here, read by every later step
        load_servable(local)
        epochs = [s.epoch for s in chosen]
        bagged_outcomes[f] = TrainOutcome(
            run_name=runs[f],
            family=f,
            run_path=target.rsplit("/", 1)[0],
            # the longest fold's history: the bag's epoch (its folds' latest best) never lies past the steps it names
            checkpoints=[{"path": target, "epoch": max(epochs), "metrics": metrics}],
            history=max((o.history for o in folds), key=len),
            resumed_from_epoch=next((o.resumed_from_epoch for o in folds if o.resumed_from_epoch is not None), None),
            recoveries=[r for o in folds for r in o.recoveries],
            resizes=[{**r, "fold_run": o.run_name} for o in folds for r in o.resizes],
            budget={
                **folds[0].budget,
                "folds": len(folds),
                "fold_runs": [o.run_name for o in folds],
                "fold_epochs": epochs,
            },
        )
        bagged[f] = Selected(
            path=local, epoch=max(epochs), metrics=metrics, skipped=[s for c in chosen for s in c.skipped], uri=target
        )
        metric = config.promotion.metric
        log.info(
            "%s: %d fold models (best %s %s); out-of-fold %s = %.5g over %d rows; bag %s",
            f,
            len(chosen),
            bagged_outcomes[f].budget.get("unit", "epoch") + "s",
            epochs,
            metric,
            metrics.get(metric, np.nan),
            len(decisions.labels),
            target,
        )
    return bagged_outcomes, bagged, decisions
