"""The batch-inference flow: predictions from a registered model or a checkpoint folder."""

from __future__ import annotations

from typing import Any

from prefect import flow

from trainflow.tasks.infer import infer, resolve_checkpoint_task
from trainflow.config import load_config
from trainflow.redact import redact_value
from trainflow.runtime import watch_for_sigterm


@flow(name="batch-inference", log_prints=True)
def batch_inference(config_path: str, overrides: dict[str, Any] | None = None, model: str | None = None) -> dict[str, Any]:
    """Predict inference.input into inference.output with model (default: models:/<registered_model>@champion)."""
    watch_for_sigterm()  # a cancel (SIGTERM) stops Ray at once and retries nothing, in every process that runs a flow
    config = load_config(config_path, overrides)
    config.require_inference()
    model_uri = model or f"models:/{config.mlflow.registered_model}@champion"
    checkpoint, pinned = resolve_checkpoint_task(model_uri, config)
    predictions = infer(checkpoint, config, pinned)
    return redact_value({"model": model_uri, "model_version_uri": pinned, "checkpoint": checkpoint,
                         "predictions_path": predictions.path, "input_rows": predictions.input_rows,
                         "output_rows": predictions.output_rows, "unseen_categories": predictions.unseen,
                         "drift": predictions.drift})
