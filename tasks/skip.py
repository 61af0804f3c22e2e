"""Task: skip a retrain whose data and training config are those of the current champion."""

from __future__ import annotations

from typing import Any

import mlflow
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from trainflow.tasks.common import in_prefect_run, retry_unless_user_error, task_logger
from trainflow.config import Config
from trainflow.run.tracking import CHECKPOINT_KEY, PUBLISHED_TAG, champion_version

SKIP_EVENT = "trainflow.retrain.skipped"
CONFIG_HASH_TAG, FINGERPRINT_TAG, FAMILY_TAG = (
    "trainflow.config_hash",
    "trainflow.data_fingerprint",
    "trainflow.model_family",
)


@task(
    name="check-unchanged",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def check_unchanged(config: Config, fingerprint: str) -> dict[str, Any] | None:
    """The summary's `skipped` when the @champion was trained on this very data (fingerprint) with this training
    config (hash of the training-relevant keys) and the retrain that registered it finished, else None."""
    uri, name = config.mlflow.tracking_uri, config.mlflow.registered_model
    version = champion_version(uri, name)
    if version is None:
        return None
    tags = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version(name, version).tags
    family = tags.get(FAMILY_TAG)
    if family not in config.model.candidates or tags.get(FINGERPRINT_TAG) != fingerprint:
        return None
    if tags.get(CONFIG_HASH_TAG) != config.training_hash(family):
        return None
    if CHECKPOINT_KEY in tags and PUBLISHED_TAG not in tags:  # its retrain stopped before the end: a rerun finishes
        task_logger("skip").info(
            "%s version %s is @champion on this data, but the retrain that registered it stopped "
            "before it finished (no %s tag): the rerun finishes it, reusing what is done",
            name,
            version,
            PUBLISHED_TAG,
        )
        return None
    skipped = {
        "reason": f"the data ({fingerprint}) and the training config are those of {name} version {version}, "
        "the champion: nothing to retrain (--force retrains anyway)",
        "champion_version": version,
        "data_fingerprint": fingerprint,
    }
    task_logger("skip").info("skipped: %s", skipped["reason"])
    if in_prefect_run():  # else no server to tell (trainflow/flows/local.py)
        emit_event(event=SKIP_EVENT, resource={"prefect.resource.id": f"trainflow.model.{name}"}, payload=skipped)
    return skipped
