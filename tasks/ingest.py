"""Task: read the table with Ray Data, check its columns and labels, fingerprint it."""

from __future__ import annotations

from dataclasses import dataclass

import ray.data
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks.common import retry_unless_user_error
from trainflow.config import Config, infer_format
from trainflow.data import (
    TableSpec, arrow_schema, check_text_columns, check_writable, count_rows_and_bad_labels, fingerprint, in_memory_bytes,
    list_files, read_table, should_materialize, table_spec,
)
from trainflow.errors import DataError
from trainflow.outputs import guard_output
from trainer.resources import check_fits
from trainflow.runtime import ensure_ray


@dataclass
class Ingested:
    dataset: ray.data.Dataset
    spec: TableSpec
    materialized: bool = True  # kept in the object store; else streamed from the files each time it is read
    table_bytes: int = 0  # in-memory size, from the files' metadata


def preflight_inference(config: Config, features: list[str]) -> None:
    """Before any training: the scoring table exists with every feature column, and the output is writable."""
    inp = config.inference.input
    ds, _, _ = read_table(inp, infer_format(inp))
    names = arrow_schema(ds, inp).names
    missing = [c for c in features + ([config.data.id_column] if config.data.id_column else []) if c not in names]
    if missing:
        raise DataError(f"inference input {inp}: column(s) {missing} not found; columns are {names}")
    guard_output(config.inference.output, config)
    check_writable(config.inference.output)


@task(name="ingest", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def ingest(config: Config) -> Ingested:
    """Read and check the training table; compute its content fingerprint."""
    config.require_workers()
    ensure_ray(config.ray.address, config.ray.runtime_env)
    check_fits(config.scaling.model_dump())  # seconds, not a placement group that waits forever
    data = config.data
    listed = list_files(data.path, data.format)  # once: a remote folder's listing is a request per page
    ds, files, fs = read_table(data.path, data.format, listed=listed)
    schema = arrow_schema(ds, data.path)
    spec = table_spec(schema, data, config.task, data.path, files=files)
    if config.inference.input:
        preflight_inference(config, spec.feature_order)
    table_bytes = in_memory_bytes(fs, files, data.format)
    materialize, why = should_materialize(data.materialize, table_bytes)
    if materialize:
        ds = ds.materialize()  # read once; the checks below and the split reuse it
    else:
        ds, _, _ = read_table(data.path, data.format, streamed=True, listed=listed)
    get_run_logger().info("table %s: %s", "materialized" if materialize else "streamed", why)
    check_text_columns(ds, spec, config.preprocess.parse_dates, data.path)
    rows, bad = count_rows_and_bad_labels(ds, data.label)
    if rows == 0:
        raise DataError(f"{data.path}: the table has no rows")
    if bad:
        raise DataError(
            f"{data.path}: label column {data.label!r} has {bad} missing, NaN or infinite value(s) out of {rows} rows; "
            "drop or fix those rows"
        )
    spec.rows, spec.fingerprint = rows, fingerprint(fs, files, schema, content=materialize, fmt=data.format)
    get_run_logger().info(
        "read %d rows from %d file(s): %d numeric, %d text, %d date feature(s); fingerprint %s",
        rows, len(files), len(spec.numeric), len(spec.categorical), len(spec.dates), spec.fingerprint,
    )
    return Ingested(ds, spec, materialize, table_bytes)
