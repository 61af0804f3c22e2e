"""Task: fit the preprocessor on the training split only, then pack both splits into tensors."""

from __future__ import annotations

from dataclasses import dataclass

import ray
import ray.data
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from preprocessors.tabular import TabularPreprocessor
from tasks.common import retry_unless_user_error
from tasks.ingest import Ingested
from tasks.split import Split
from trainflow.config import Config
from trainflow.errors import ConfigError
from trainer.budget import Budget, resolve_budget
from trainer.loop import class_weights
from trainer.model import check_model
from trainflow.data import fit_preprocessor, fits_in_object_store, pack
from trainflow.memory import check_packed_size, is_out_of_memory, out_of_memory_error


@dataclass
class Prepared:
    preprocessor: TabularPreprocessor
    train: ray.data.Dataset
    val: ray.data.Dataset
    materialized: bool
    budget: Budget  # batch size, epochs and patience resolved from the training rows


@task(name="preprocess", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def preprocess(ingested: Ingested, parts: Split, config: Config) -> Prepared:
    """Fit on train, transform train and validation; materialize when the packed data fits in memory."""
    prep = fit_preprocessor(parts.train, ingested.spec, config.task, config.preprocess)
    try:
        check_model(prep, config.model.model_dump())  # a user's module fails here, before any training
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        class_weights(config.train.model_dump(), prep)  # the loop's own check, before any worker starts
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    rows = parts.train_rows + parts.val_rows
    budget = resolve_budget(config.train.model_dump(), prep.train_rows, config.scaling.num_workers)
    estimate = check_packed_size(
        prep, rows, budget.batch_size, max(1, config.scaling.num_workers), ray.cluster_resources().get("memory", 0),
        ingested.spec.path,
    )
    materialize = fits_in_object_store(rows, prep.num_features)
    try:
        train, val = pack(parts.train, parts.val, prep, materialize)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise out_of_memory_error("preprocessing", config.scaling.num_workers) from None
        raise
    get_run_logger().info(
        "preprocessor: %d input columns -> %d features (%d one-hot, %d embedded: %s; %d date column(s))%s; training set %s",
        len(prep.feature_order), prep.num_features, len(prep.categorical), len(prep.embedded),
        {c: f"{len(s['categories'])} values, dim {s['dim']}" for c, s in prep.embedded.items()}, len(prep.dates),
        f", classes {prep.classes}" if prep.classes is not None else "",
        "materialized in the object store" if materialize else "streamed (larger than the object store budget)",
    )
    get_run_logger().info(
        "packed size: %d bytes per row, %.1f MiB for %d rows", estimate["bytes_per_row"], estimate["table_bytes"] / 2**20, rows
    )
    return Prepared(prep, train, val, materialize, budget)
