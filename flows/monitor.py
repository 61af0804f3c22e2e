"""The monitor flow: live performance of the deployed model once the true labels of its predictions arrive, or
estimated from its probabilities before they do."""

from __future__ import annotations

from typing import Any

from prefect import flow

from trainflow.flows.handover import flow_config
from trainflow.tasks.monitor import measure_live
from trainflow.run.redact import redact_value
from trainflow.run.runtime import plain_progress, watch_for_sigterm


@flow(name="monitor", log_prints=True)
def monitor(config_path: str, labels: str | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Score the predictions under inference.output against labels (a table of id column + label); without labels,
    estimate a classifier's performance from its probabilities (CBPE). Reads with pyarrow: no Ray."""
    watch_for_sigterm()
    plain_progress()  # MLflow's transfer bars in a terminal only
    config = flow_config(config_path, overrides)
    return redact_value({"monitor": measure_live(config, labels)})
