"""Task: with several model families in one run (model.type a list), keep the best on the validation split (or the
out-of-fold predictions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.tasks.values import Selected, TrainOutcome
from trainflow.trainer.serving.checkpoint import metric_value
from trainflow.config import ENSEMBLE, Config
from trainflow.errors import TrainingError


@dataclass
class Candidates:
    winner: str  # the family that goes on to register and the gate
    metric: str
    mode: str
    scores: list[dict[str, Any]]  # per family, best first: family, run_name, score, epoch, checkpoint


def run_names(config: Config, run_name: str) -> dict[str, str]:
    """Each family's Ray Train run name: the run name itself for one family, <run>-<family> for several,
    so each resumes on its own."""
    families = config.model.families
    return {f: run_name if len(families) == 1 else f"{run_name}-{f}" for f in families}


@task(name="compare-families", cache_policy=NO_CACHE)
def compare(
    config: Config, outcomes: dict[str, TrainOutcome], selections: dict[str, Selected], on: str = "the validation split"
) -> Candidates:
    """The family whose best checkpoint scores best by promotion.metric on the validation split (or, with
    cross-fitting, on the out-of-fold predictions: on names them)."""
    metric, mode = config.promotion.metric, config.promotion.mode
    rows = []
    for family, selected in selections.items():
        rows.append(
            {
                "family": family,
                "run_name": outcomes[family].run_name,
                metric: metric_value(selected.metrics, metric),
                # an ensemble has no epochs or rounds of its own: None, shown as a dash with a word
                "epoch": None if family == ENSEMBLE else selected.epoch,
                "epochs_run": None if family == ENSEMBLE else len(outcomes[family].history),
                "checkpoint": selected.uri or selected.path,
                "unit": None
                if family == ENSEMBLE
                else outcomes[family].budget.get("unit", "epoch"),  # boosters: rounds
            }
        )
    scored = [r for r in rows if r[metric] is not None]
    if not scored:
        raise TrainingError(f"no model family reported a finite {metric}: {[r['family'] for r in rows]}")
    scored.sort(key=lambda r: r[metric], reverse=(mode == "max"))
    ranked = scored + [r for r in rows if r[metric] is None]
    log = get_run_logger()
    for r in ranked:
        log.info(
            "candidate %s (run %s): %s = %s at %s %s",
            r["family"],
            r["run_name"],
            metric,
            r[metric],
            r.get("unit") or "epoch",
            r["epoch"],
        )
    log.info("best family on %s by %s (%s): %s", on, metric, mode, scored[0]["family"])
    return Candidates(winner=scored[0]["family"], metric=metric, mode=mode, scores=ranked)
