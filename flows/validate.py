"""The validate flow: every check a retrain makes before it trains, and nothing after (a dry run)."""

from __future__ import annotations

from typing import Any

from prefect import flow

from trainflow.flows.handover import flow_config
from trainflow.config import Config
from trainflow.run.redact import redact_value
from trainflow.run.runtime import plain_progress, watch_for_sigterm
from trainflow.tasks.common import step
from trainflow.tasks.ingest import ingest, throwaway_copy
from trainflow.tasks.preprocess import preprocess
from trainflow.tasks.split import split
from trainflow.tasks.validate import validate_data


@flow(name="validate", log_prints=True)
def validate(config_path: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Config, training table (columns, labels, text), output location, scoring table (columns, kinds, ids, unseen
    values when on_unseen is error), the cluster's fit, memory of the packed data per family, and the data against
    the champion's baseline; a failed check raises with the file, column or key to fix. Trains nothing."""
    watch_for_sigterm()
    plain_progress()  # MLflow's transfer bars in a terminal only
    config = flow_config(config_path, overrides)
    if config.task_inferred:
        print(config.task_inferred)
    return checks(config)


def checks(config: Config, in_flow: bool = True) -> dict[str, Any]:
    """The flow's steps (in_flow=False: the same steps as plain functions, without Prefect: flows/local.py). Ray
    starts only for a step that needs it: a table read through Ray Data (a CSV, a large one) or a named cluster. A
    PostgreSQL source's rows are checked in a temporary copy, removed after."""
    with throwaway_copy(config) as config:
        ingested = step(ingest, in_flow)(config)
        parts = step(split, in_flow)(ingested, config)
        prepared = step(preprocess, in_flow)(ingested, parts, config, packed=False)
        validation = step(validate_data, in_flow)(config, prepared.preprocessor)
    spec = ingested.spec
    return redact_value(
        {
            "valid": True,
            "task": config.task,
            "data_path": spec.path,
            "rows": spec.rows,
            "train_rows": parts.train_rows,
            "validation_rows": parts.val_rows,
            "test_rows": parts.test_rows,
            "folds": parts.fold_count,
            "split": parts.plan.describe() if parts.plan else None,
            "split_note": parts.note,
            "features": {"numeric": spec.numeric, "text": spec.categorical, "dates": spec.dates},
            "packed_features": prepared.preprocessor.num_features,
            "materialized": prepared.materialized,
            "families": {name: budget.to_dict() for name, budget in prepared.budgets.items()},
            "families_left_out": prepared.left_out or None,
            "inference_input": config.inference.input,
            "inference_output": config.inference.output,
            "validation": {k: v for k, v in validation.items() if k != "checks"},
        }
    )
