"""Task: retention once a retrain has published (trainflow/retention.py): earlier runs' folders that nothing needs
go, under this run's own lock, and the summary says what went, what stayed and why."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from trainflow.config import Config
from trainflow.errors import ConfigError
from trainflow.retention import collect
from trainflow.tasks.common import task_logger


@task(name="retention", cache_policy=NO_CACHE)
def retain(config: Config, run_name: str) -> dict[str, Any] | None:
    """Apply config.retention after run_name published; None when it keeps everything (the default). A failure is
    said and leaves the run published: the next retrain, or `trainflow gc`, collects again."""
    if not config.retention.limited:
        return None
    log = task_logger("retention")
    try:
        done = collect(config, current=run_name, needed=output_version(config))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model is published; storage left as it was is no failure of it
        log.warning("retention: nothing more removed: %s: %s (trainflow gc collects again)", type(exc).__name__, exc)
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    log.info(describe(done))
    return done


def describe(done: dict[str, Any]) -> str:
    """One line: what a collection removed and kept."""
    verb = "would remove" if done["dry_run"] else "removed"
    gone = ", ".join(r["run"] for r in done["removed"]) or "nothing"
    return (
        f"retention: {verb} {gone} ({done['bytes_freed'] / 2**20:.1f} MiB); kept {len(done['kept'])} run(s): "
        + "; ".join(f"{k['run']} ({k['why']})" for k in done["kept"][:10])
    )


def output_version(config) -> dict[str, str]:
    """The version the config's Parquet predictions output came from (its manifest): the lineage a kept output
    needs. (A Delta, Iceberg or PostgreSQL output carries each row's model_version itself.)"""
    from trainflow.tables.outputs import read_manifest

    out = config.inference
    if out.output is None or out.output_format != "parquet":
        return {}
    manifest = read_manifest(out.output) or {}
    model = str(manifest.get("model") or "")
    prefix = f"models:/{config.mlflow.registered_model}/"
    if not model.startswith(prefix) or not model[len(prefix) :].isdigit():
        return {}
    version = model[len(prefix) :]
    return {version: f"version {version} made the predictions at {out.output}"}
