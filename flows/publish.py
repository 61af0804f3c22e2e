"""What retrain and tune do once a checkpoint is selected: calibrate -> register -> promote -> explain -> infer ->
summarize -> report.

A function the flows call, not a subflow: its tasks stay in the calling flow run, whose id the MLflow run key
(tasks/mlflow_run.py) and the model version's lineage tags record.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from trainflow.config import Config
from trainflow.tasks.calibrate import calibrate
from trainflow.tasks.explain import explain
from trainflow.tasks.infer import infer
from trainflow.tasks.ingest import Ingested
from trainflow.tasks.promote import promote
from trainflow.tasks.register import register
from trainflow.tasks.report import report
from trainflow.tasks.select import Selected
from trainflow.tasks.split import Split
from trainflow.tasks.summary import summarize
from trainflow.tasks.train import TrainOutcome


def publish(config: Config, ingested: Ingested, parts: Split, outcome: TrainOutcome, selected: Selected,
            extra: dict[str, Any]) -> dict[str, Any]:
    """Register the selected checkpoint, gate it against @champion, predict inference.input with whichever
    version serves after the gate (a rejected challenger never writes predictions), and report; the summary."""
    # stored in the checkpoint before it is registered; its scored validation split is the gate's challenger side
    fit, scored = calibrate(config, parts.val, selected, outcome.family)
    registered = register(config, ingested, outcome, selected)
    promotion = promote(config, parts.val, selected, registered, scored)
    importance = explain(config, parts.val, selected.path, promotion, registered)
    predictions = None
    if config.inference.input and promotion.serving_version is None:
        get_run_logger().warning("nothing predicted: no version of %s is @champion (%s)", promotion.model_name,
                                 promotion.reason)
    elif config.inference.input:
        predictions = infer(promotion.serving_checkpoint, config, f"models:/{promotion.model_name}/{promotion.serving_version}")
    summary = summarize(ingested, parts, outcome, selected, registered, promotion, predictions,
                        extra={"task": config.task, "feature_importance": importance, "calibration_fit": fit, **extra})
    report(config, outcome.history, summary)
    return summary
