"""Task: the Ray Train run name, stable across Prefect retries of the same flow run."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from trainflow.run.storage import check_run_name


@task(name="run-name", cache_policy=NO_CACHE)
def resolve_run_name(requested: str | None, prefix: str = "retrain") -> str:
    """The requested name, or one derived from the flow run's id (the same on every retry of that run)."""
    if requested is not None:
        return check_run_name(requested)
    run_id = flow_run.get_id() or ""
    started = flow_run.get_scheduled_start_time()
    stamp = started.strftime("%Y%m%d-%H%M%S") if started else "local"
    return f"{prefix}-{stamp}-{str(run_id)[:8]}"


DONE_SUFFIX = "-done.json"  # under storage_path: a run name's retrain that finished, with its summary


def config_digest(config) -> str:
    """A digest of the whole resolved config: a finished run is reused only by a start with the very same config."""
    import hashlib
    import json

    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _done_uri(config, run_name: str) -> str:
    from trainflow.run.storage import join

    return join(config.storage_path, f"{run_name}{DONE_SUFFIX}")


def record_finished(config, run_name: str, fingerprint: str | None, summary: dict) -> None:
    """After a retrain published (under its run lock): what a later start of the same name, data and config needs
    to know that there is nothing left to do. Best effort: without it a later start redoes the cheap steps."""
    import datetime as dt
    import json

    from trainflow.run.redact import redact_value
    from trainflow.run.storage import replace_bytes

    if fingerprint is None or not summary.get("model_version"):
        return
    record = {
        "run_name": run_name,
        "data_fingerprint": fingerprint,
        "config_digest": config_digest(config),
        "model": config.mlflow.registered_model,
        "version": str(summary["model_version"]),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "summary": redact_value(json.loads(json.dumps(summary, default=str))),
    }
    try:
        replace_bytes(_done_uri(config, run_name), json.dumps(record).encode())  # a reader never sees half of it
    except Exception as exc:  # noqa: BLE001 - the run is published; a later start of this name redoes cheap steps
        from trainflow.tasks.common import task_logger

        task_logger("run-name").warning(
            "could not record that run %s finished: %s: %s", run_name, type(exc).__name__, exc
        )


@task(name="check-finished", cache_policy=NO_CACHE)
def finished_before(config, run_name: str, fingerprint: str | None) -> dict | None:
    """The summary of a retrain of this run name that finished on the same data with the same config (a start of
    the same name that waited for it under the run lock has nothing to do), else None. The record is a claim read
    from storage: it counts only when the registry's version says the same run name and data."""
    import json

    import mlflow

    from trainflow.run.storage import read_text

    if fingerprint is None:
        return None
    try:
        record = json.loads(read_text(_done_uri(config, run_name)))
        claimed = (record["run_name"], record["data_fingerprint"], record["config_digest"], record["model"])
        version, summary = str(int(record["version"])), record["summary"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none, or not one trainflow wrote: the run does its work
    if claimed != (run_name, fingerprint, config_digest(config), config.mlflow.registered_model) or not isinstance(
        summary, dict
    ):
        return None
    uri = config.mlflow.tracking_uri
    try:
        tags = (
            mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
            .get_model_version(config.mlflow.registered_model, version)
            .tags
        )
    except mlflow.exceptions.MlflowException:
        return None
    if tags.get("trainflow.run_name") != run_name or tags.get("trainflow.data_fingerprint") != fingerprint:
        return None
    from trainflow.tasks.common import task_logger

    task_logger("run-name").info(
        "run %s finished at %s on the same data and config (%s version %s): nothing to do; its summary follows "
        "(--force or another --run-name retrains)",
        run_name,
        record.get("finished"),
        record["model"],
        version,
    )
    return {**summary, "already_finished": record.get("finished")}
