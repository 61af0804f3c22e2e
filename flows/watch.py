"""The watch flow: emit a Prefect event when the training table's files change (a Delta table's version, an Iceberg
table's snapshot, a PostgreSQL source's watermark: data.watermark's maximum or the row count), so a deployment trigger can start `retrain/scheduled` (deployments/prefect.yaml); a small
deployment runs it on a short interval."""

from __future__ import annotations

import hashlib
from typing import Any

from prefect import flow, get_run_logger
from prefect.events import emit_event
from prefect.variables import Variable

from trainflow.flows.handover import flow_config
from trainflow.tables.sources import resolve_snapshot, source
from trainflow.tables.files import list_files
from trainflow.run.redact import redact_text

DATA_EVENT = "trainflow.data.changed"


def source_fingerprint(data) -> str:
    """A Delta or Iceberg table's current snapshot (from its log or metadata), a PostgreSQL source's watermark (one
    aggregate query), or files_fingerprint."""
    kind = source(data.format).kind
    if kind == "query":
        from trainflow.tables.postgres import SqlSource

        return SqlSource.of(data).watermark(data.watermark)
    if kind == "snapshot":
        return resolve_snapshot(data.model_copy(update={"snapshot": None})).fingerprint
    return files_fingerprint(data.path, data.format)


def files_fingerprint(path: str, fmt: str) -> str:
    """A hash of the table's file names, sizes and modification times (metadata only: no file is read)."""
    fs, files = list_files(path, fmt)
    h = hashlib.blake2b(digest_size=16)
    for info in fs.get_file_info(files):
        h.update(f"{info.path}:{info.size}:{info.mtime_ns}".encode())
    return "files:" + h.hexdigest()


@flow(name="watch-data", log_prints=True)
def watch_data(config_path: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compare data.path's files with the last look (a Prefect variable) and emit trainflow.data.changed when they
    differ; the first look only records them."""
    config = flow_config(config_path, overrides)
    key = hashlib.blake2b(f"{config.data.where}|{config.data.sql or ''}".encode(), digest_size=8).hexdigest()
    name = f"trainflow-watch-{key}"
    now = source_fingerprint(config.data)
    last = Variable.get(name, default=None)
    changed = last is not None and last != now
    if last != now:
        Variable.set(name, now, overwrite=True)
    if changed:
        emit_event(
            event=DATA_EVENT,
            resource={"prefect.resource.id": f"trainflow.data.{key}"},
            payload={
                "config_path": config_path,
                "data_path": redact_text(config.data.where),
                "fingerprint": now,
                "previous": last,
            },
        )
    get_run_logger().info(
        "%s: %s (%s)",
        redact_text(config.data.where),
        "changed" if changed else "unchanged" if last else "first look",
        now,
    )
    return {"changed": changed, "fingerprint": now, "previous": last}
