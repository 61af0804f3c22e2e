"""The batch-inference flow: predictions from a registered model or a checkpoint folder."""

from __future__ import annotations

from typing import Any

from prefect import flow

from trainflow.flows.handover import flow_config
from trainflow.tasks.infer import infer, resolve_checkpoint_task
from trainflow.tasks.common import step
from trainflow.tasks.summary import skipped_summary
from trainflow.config import Config
from trainflow.run.redact import redact_value
from trainflow.run.runtime import plain_progress, watch_for_sigterm


@flow(name="batch-inference", log_prints=True)
def batch_inference(
    config_path: str, overrides: dict[str, Any] | None = None, model: str | None = None
) -> dict[str, Any]:
    """Predict inference.input into inference.output with model (default: models:/<registered_model>@champion)."""
    watch_for_sigterm()  # a cancel (SIGTERM) stops Ray at once and retries nothing, in every process that runs a flow
    plain_progress()  # MLflow's transfer bars in a terminal only
    return score(flow_config(config_path, overrides), model)


def score(config: Config, model: str | None, in_flow: bool = True) -> dict[str, Any]:
    """The flow's steps (in_flow=False: the same steps as plain functions, without Prefect)."""
    config.require_inference()
    model_uri = model or f"models:/{config.mlflow.registered_model}@champion"
    checkpoint, pinned = step(resolve_checkpoint_task, in_flow)(model_uri, config)
    predictions = step(infer, in_flow)(checkpoint, config, pinned)
    return redact_value(
        {
            "model": model_uri,
            "model_version_uri": pinned,
            "checkpoint": checkpoint,
            "predictions_path": predictions.path,
            "input_rows": predictions.input_rows,
            "output_rows": predictions.output_rows,
            "unseen_categories": predictions.unseen,
            "drift": predictions.drift,
            "estimated_metrics": predictions.estimated,
        }
    )


def skipped_run(config: Config, run_name: str, skipped: dict[str, Any], in_flow: bool = True) -> dict[str, Any]:
    """A retrain with nothing to train: the champion scores inference.input (when configured); the summary says why."""
    model = f"models:/{config.mlflow.registered_model}/{skipped['champion_version']}"
    from trainflow.tasks.mlflow_run import end_earlier_starts

    end_earlier_starts(None, None, run_name, None, config)  # a start of this name killed after the champion's gate
    predictions = None
    if config.inference.input:
        checkpoint, pinned = step(resolve_checkpoint_task, in_flow)(model, config)
        predictions = step(infer, in_flow)(checkpoint, config, pinned, run_name)
    return step(skipped_summary, in_flow)(config, run_name, skipped, model, predictions)
