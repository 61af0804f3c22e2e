"""Task: seeded train/validation split, stratified for classification."""

from __future__ import annotations

from dataclasses import dataclass

import ray.data
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.tasks.common import retry_unless_user_error
from trainflow.tasks.ingest import Ingested
from trainflow.config import Config
from trainflow.data import split_table
from trainflow.errors import DataError


@dataclass
class Split:
    train: ray.data.Dataset
    val: ray.data.Dataset
    train_rows: int
    val_rows: int
    materialized: bool = True


@task(name="split", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def split(ingested: Ingested, config: Config) -> Split:
    """Split the table into training and validation parts."""
    keys = [config.data.id_column] if config.data.id_column else ingested.spec.feature_order + [config.data.label]
    train, val, n_train, n_val = split_table(
        ingested.dataset, config.task, config.data.label, config.split.validation_fraction, config.split.seed,
        keys, ingested.materialized,
    )
    if n_train == 0 or n_val == 0:
        raise DataError(
            f"{ingested.spec.path}: {ingested.spec.rows} rows are too few to split with "
            f"validation_fraction={config.split.validation_fraction} ({n_train} train, {n_val} validation)"
        )
    get_run_logger().info("split: %d training rows, %d validation rows (by a seeded hash of %s)", n_train, n_val,
                          f"id column {config.data.id_column!r}" if config.data.id_column else "each row's values")
    return Split(train, val, n_train, n_val, ingested.materialized)
