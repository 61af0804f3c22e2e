"""Task: fit the preprocessor on the training split only, then pack both splits into tensors."""

from __future__ import annotations

from dataclasses import dataclass

import ray.data
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from preprocessors.tabular import TabularPreprocessor
from tasks.common import retry_unless_user_error
from tasks.ingest import Ingested
from tasks.split import Split
from trainflow.config import Config
from trainflow.data import fit_preprocessor, fits_in_object_store, pack


@dataclass
class Prepared:
    preprocessor: TabularPreprocessor
    train: ray.data.Dataset
    val: ray.data.Dataset
    materialized: bool


@task(name="preprocess", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def preprocess(ingested: Ingested, parts: Split, config: Config) -> Prepared:
    """Fit on train, transform train and validation; materialize when the packed data fits in memory."""
    prep = fit_preprocessor(parts.train, ingested.spec, config.task, config.preprocess)
    materialize = fits_in_object_store(parts.train_rows + parts.val_rows, prep.num_features)
    train, val = pack(parts.train, parts.val, prep, materialize)
    get_run_logger().info(
        "preprocessor: %d input columns -> %d features (%d one-hot, %d embedded: %s; %d date column(s))%s; training set %s",
        len(prep.feature_order), prep.num_features, len(prep.categorical), len(prep.embedded),
        {c: f"{len(s['categories'])} values, dim {s['dim']}" for c, s in prep.embedded.items()}, len(prep.dates),
        f", classes {prep.classes}" if prep.classes is not None else "",
        "materialized in the object store" if materialize else "streamed (larger than the object store budget)",
    )
    return Prepared(prep, train, val, materialize)
