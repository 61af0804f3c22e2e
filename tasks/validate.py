"""Task: the new training data against the current champion's training baseline, before any training."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from trainflow.preprocessors.baseline import compare_baselines
from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.tasks.common import in_prefect_run, retry_unless_user_error, task_logger
from trainflow.trainer.resolve import allowed_class_paths, resolve_checkpoint
from trainflow.config import Config
from trainflow.errors import DataError
from trainflow.run.tracking import champion_version

VALIDATION_EVENT = "trainflow.validation.failed"


def describe(c: dict[str, Any]) -> str:
    where = f"column {c['column']!r}" if c["column"] and c["column"] != "(label)" else (c["column"] or "the table")
    detail = f" (score {c['score']} > {c['threshold']})" if c["score"] is not None and c["check"] != "row_count" else ""
    extra = f"; gone {c['gone']}, added {c['added']}" if c["check"] == "columns" else ""
    return f"{where}: {c['check']} was {c['champion']}, now {c['now']}{detail}{extra}; relax with {c['key']}"


@task(
    name="validate", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE
)
def validate_data(config: Config, preprocessor: TabularPreprocessor) -> dict[str, Any]:
    """Compare this run's training split (its fitted baseline) with the @champion's; with validation.on_anomaly
    fail, any anomaly ends the run (exit 2) before training, naming the column, the check, both values and the
    key that relaxes it. Returns the summary's `validation`."""
    log = task_logger("validate")
    uri, name = config.mlflow.tracking_uri, config.mlflow.registered_model
    version = champion_version(uri, name)
    if version is None:
        return {"champion_version": None, "checks": [], "anomalies": [], "note": "no champion to compare with"}
    champion = TabularPreprocessor.load(
        resolve_checkpoint(f"models:/{name}/{version}", allowed_class_paths(config), uri)
    )
    if not champion.baseline.get("columns") or not preprocessor.baseline.get("columns"):
        return {"champion_version": version, "checks": [], "anomalies": [], "note": "the champion has no baseline"}
    checks = compare_baselines(champion.baseline, preprocessor.baseline, config.validation)
    anomalies = [describe(c) for c in checks if c["anomaly"]]
    result = {
        "champion_version": version,
        "on_anomaly": config.validation.on_anomaly,
        "checks": checks,
        "anomalies": anomalies,
    }
    if anomalies and in_prefect_run():
        emit_event(
            event=VALIDATION_EVENT,
            resource={"prefect.resource.id": f"trainflow.model.{name}"},
            payload={"data_path": config.data.path, "champion_version": version, "anomalies": anomalies},
        )
    if anomalies:
        if config.validation.on_anomaly == "fail":
            raise DataError(
                f"{config.data.path}: the training data fails validation against {name} version {version}'s "
                "training data: " + "; ".join(anomalies) + " (or set validation.on_anomaly: warn)"
            )
        for a in anomalies:
            log.warning("validation: %s", a)
    log.info("validation against version %s: %d check(s), %d anomal(ies)", version, len(checks), len(anomalies))
    return result
