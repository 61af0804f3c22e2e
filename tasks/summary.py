"""Task: the run's summary, printed and optionally written as JSON."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from trainflow.tasks.values import Predictions, Ingested, Promotion, Registered, Selected, Split, TrainOutcome
from trainflow.config import Config
from trainflow.run.redact import redact_value
from trainflow.run.storage import is_uri


@task(name="summarize", cache_policy=NO_CACHE)
def summarize(
    ingested: Ingested,
    parts: Split,
    outcome: TrainOutcome,
    selected: Selected,
    registered: Registered,
    promotion: Promotion,
    predictions: Predictions | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a person or a script needs to know about the run, as plain data (no secrets: redact_value)."""
    return redact_value(
        {
            "run_name": outcome.run_name,
            "model_family": outcome.family,
            "data_path": ingested.spec.path,
            "data_fingerprint": ingested.spec.fingerprint,
            **({"data_snapshot": ingested.spec.snapshot} if ingested.spec.snapshot else {}),
            "training_rows": ingested.spec.rows,
            "data_materialized": parts.materialized,
            "train_rows": parts.train_rows,
            "validation_rows": parts.val_rows,
            "ray_run_path": outcome.run_path,
            "epochs_run": len(outcome.history),
            "training_budget": outcome.budget,
            "resumed_from_epoch": outcome.resumed_from_epoch,
            "recoveries": outcome.recoveries,
            "resizes": outcome.resizes,
            # path: a local folder holding it (the checkpoint itself on local storage, the run's checked copy otherwise)
            "best_checkpoint": {
                "path": selected.uri if selected.uri and not is_uri(selected.uri) else selected.path,
                "uri": selected.uri or selected.path,
                "epoch": selected.epoch,
                "metrics": selected.metrics,
            },
            "skipped_checkpoints": selected.skipped,
            "mlflow_run_id": registered.run_id,
            "registered_model": registered.model_name,
            "model_version": registered.model_version,
            "model_uri": registered.model_uri,
            "promotion": promotion.record(),
            "calibration": promotion.calibration,
            "slices": promotion.slices,
            **prediction_fields(predictions, promotion.serving_version),
            **(extra or {}),
        }
    )


def prediction_fields(predictions: Predictions | None, version: str | None) -> dict[str, Any]:
    """A summary's fields about the predictions written (all None when none were: no inference.input)."""
    p = predictions
    return {
        "predictions_path": p.path if p else None,
        "input_rows": p.input_rows if p else None,
        "output_rows": p.output_rows if p else None,
        "unseen_categories": p.unseen if p else None,
        "drift": p.drift if p else None,
        "estimated_metrics": p.estimated if p else None,
        "predictions_model_version": version if p else None,
    }


@task(name="summarize-skipped", cache_policy=NO_CACHE)
def skipped_summary(
    config: Config, run_name: str, skipped: dict[str, Any], model: str, predictions: Predictions | None
) -> dict[str, Any]:
    """The summary of a retrain that had nothing to train: why, the champion that served, its predictions."""
    return redact_value(
        {
            "run_name": run_name,
            "skipped": skipped,
            "data_path": config.data.path,
            "data_fingerprint": skipped["data_fingerprint"],
            "model_uri": model,
            "model_version": skipped["champion_version"],
            **prediction_fields(predictions, skipped["champion_version"]),
        }
    )
