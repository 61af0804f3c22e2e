"""Task: read the table with Ray Data, check its columns and labels, fingerprint it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from prefect import task
from prefect.cache_policies import NO_CACHE

from trainflow.tasks.common import retry_unless_user_error, task_logger
from trainflow.config import Config, infer_format
from trainflow.data import (
    arrow_schema,
    bounded_blocks,
    count_nulls,
    count_rows_and_bad_labels,
    read_table,
    should_materialize,
    streamed_read_args,
)
from trainflow.tables.sources import (
    Snapshot,
    read_arrow as snapshot_arrow,
    read_dataset,
    resolve_snapshot,
    snapshot_bytes,
    source,
)
from trainflow.preprocessors.fit import check_text_columns
from trainflow.tables.files import (
    INFERENCE_INPUT,
    IN_PROCESS_BYTES,
    TableSpec,
    fingerprint,
    in_memory_bytes,
    is_numeric_type,
    is_string_type,
    is_temporal_type,
    list_files,
    open_dataset,
    read_arrow,
    table_spec,
)
from trainflow.run.storage import with_scheme
from trainflow.errors import DataError
from trainflow.tables.outputs import check_destination
from trainflow.trainer.resources import check_fits
from trainflow.run.runtime import cluster_named, ensure_ray
from trainflow.tasks.values import Ingested

SOURCE_SUFFIX = "-source.json"  # under storage_path: the snapshot a run name's first attempt read


def _kind(t) -> str:
    # text and dates are one kind here: ISO-8601 text becomes date parts whatever the column's storage type
    return "number" if is_numeric_type(t) else "text or date" if is_string_type(t) or is_temporal_type(t) else str(t)


def preflight_inference(config: Config, spec: TableSpec, train_schema) -> None:
    """Before any training: the scoring table has every feature column, of the kind the model is trained on,
    and ids without gaps."""
    inp = config.inference.input
    fmt = infer_format(inp)
    fs, files = list_files(inp, fmt, INFERENCE_INPUT)
    here = source(fmt).reads_here  # its metadata says the schema, and the id column is read alone: no Ray pass
    if here:
        scoring = open_dataset(inp, fmt)
        schema = scoring.schema
    else:
        ensure_ray(**config.ray_start)
        ds, _, _ = read_table(inp, fmt, listed=(fs, files), csv=config.data.csv)
        schema = arrow_schema(ds, inp)
    names = schema.names
    id_column = config.data.id_column
    missing = [c for c in spec.feature_order + ([id_column] if id_column else []) if c not in names]
    if missing:
        raise DataError(f"inference input {inp}: column(s) {missing} not found; columns are {names}")
    for col in spec.feature_order:
        trained, scored = _kind(train_schema.field(col).type), _kind(schema.field(col).type)
        if trained != scored:
            raise DataError(
                f"inference input {inp}: column {col!r} is {scored} ({schema.field(col).type}) but the training table "
                f"{config.data.path} has it as {trained} ({train_schema.field(col).type}); store it as {trained}"
            )
    if id_column:
        nulls = (
            scoring.to_table(columns=[id_column]).column(id_column).null_count if here else count_nulls(ds, id_column)
        )
        if nulls:
            raise DataError(
                f"inference input {inp}: id column {id_column!r} is empty in {nulls} row(s); "
                "every prediction needs its id"
            )


def _sizing(data, fs, files) -> tuple[bool, int, str]:
    table_bytes = in_memory_bytes(fs, files, data.format)
    materialize, why = should_materialize(data.materialize, table_bytes)
    return materialize, table_bytes, why


def _fingerprint(data, fs, files) -> tuple[str, bool, int, str]:
    """(fingerprint, materialize?, in-memory bytes, why): bytes for a table that fits, file metadata otherwise."""
    materialize, table_bytes, why = _sizing(data, fs, files)
    return fingerprint(fs, files, content=materialize, fmt=data.format, csv=data.csv), materialize, table_bytes, why


@task(
    name="fingerprint",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def table_fingerprint(config: Config) -> str:
    """The training table's fingerprint as ingest computes it, from the files alone (no Ray Data read), or a Delta
    or Iceberg table's from its snapshot: enough to tell that a retrain would train on the champion's own data
    (which its run checked already)."""
    if source(config.data.format).kind == "snapshot":
        return resolve_snapshot(config.data).fingerprint
    if cluster_named(config.ray.address):  # its object store's size decides content or metadata
        ensure_ray(**config.ray_start)
    fs, files = list_files(config.data.path, config.data.format)
    return _fingerprint(config.data, fs, files)[0]


@task(name="pin-source", cache_policy=NO_CACHE)
def pin_source(config: Config, run_name: str) -> Config:
    """A Delta or Iceberg table's snapshot for this run name: the one its first attempt recorded in storage (a rerun
    or a resume reads what it read, however the table grew since), else data.snapshot or the table's current one,
    recorded now. A record naming another table is not trusted: the run reads the table's current snapshot. A
    PostgreSQL source: its copy (_pin_copy)."""
    import json

    from trainflow.retention import record_start
    from trainflow.run.storage import join, read_text

    data = config.data
    if source(data.format).kind == "files":
        return config
    record_start(config, run_name)  # a source record or copy is written below: the run is recorded first
    log = task_logger("pin-source")
    record_uri = join(config.storage_path, f"{run_name}{SOURCE_SUFFIX}")
    try:
        recorded = json.loads(read_text(record_uri))
    except (OSError, ValueError):
        recorded = None
    if source(data.format).kind == "query":
        return config.model_copy(update={"data": _pin_copy(config, run_name, record_uri, recorded, log)})
    if isinstance(recorded, dict) and (recorded.get("format"), recorded.get("table")) == (data.format, data.path):
        pinned = recorded.get("snapshot")
        if isinstance(pinned, int) and (data.snapshot is None or data.snapshot == pinned):
            snap = resolve_snapshot(data, pinned)
            if snap.table_id == recorded.get("table_id"):
                log.info("%s: what run %s read first (%s)", snap.describe(), run_name, record_uri)
                return config.model_copy(update={"data": data.model_copy(update={"snapshot": snap.snapshot})})
        log.warning("%s names another table or snapshot than this run reads; not followed", record_uri)
    snap = resolve_snapshot(data)
    _record(record_uri, json.dumps(snap.record()).encode(), recorded)
    log.info("%s (recorded for reruns of %s)", snap.describe(), run_name)
    return config.model_copy(update={"data": data.model_copy(update={"snapshot": snap.snapshot})})


def _record(record_uri: str, body: bytes, recorded: Any) -> None:
    """The run's source record, written whole where none is: a local file never over one that appeared meanwhile;
    on an object store, where none was (the run lock serializes this run name)."""
    from trainflow.run.storage import is_uri, replace_bytes, write_new

    try:
        if not is_uri(record_uri):
            write_new(record_uri, body)
        elif recorded is None and not _exists(record_uri):
            replace_bytes(record_uri, body)
    except FileExistsError:
        pass  # another record is there (not followed): this run reads its own snapshot or copy


def _pin_copy(config: Config, run_name: str, record_uri: str, recorded: Any, log):
    """A PostgreSQL source for this run name: the copy its first attempt made (checked against the files in
    storage: a record naming other files, another server or query, or files outside this run's storage is not
    followed), else a new copy, recorded. The run then reads the copy's Parquet files."""
    import json
    import uuid

    from trainflow.tables.postgres import SqlSource, copy_to_parquet
    from trainflow.run.storage import join

    data = config.data
    sql = SqlSource.of(data)
    prefix = join(config.storage_path, f"{run_name}-source-")
    if _same_source(recorded, sql, data.format):
        if _copy_intact(recorded, prefix):
            log.info(
                "%s: the copy run %s made first (%s rows, %s, copied %s)",
                sql.describe(),
                run_name,
                f"{recorded['rows']:,}",
                recorded["location"],
                recorded["copied_at"],
            )
            return data.as_copy(recorded)
        log.warning("%s names files that are not all there as written; a new copy is made", record_uri)
    elif recorded is not None:
        log.warning("%s names another source than this run reads; not followed", record_uri)
    for left in _unrecorded_copies(config.storage_path, run_name, recorded):
        log.info("removed %s: a copy of run %s that was cut short (killed) and never recorded", left, run_name)
    folder = prefix + uuid.uuid4().hex[:8]
    record = copy_to_parquet(sql, folder)
    _record(record_uri, json.dumps(record).encode(), recorded)
    log.info(
        "%s: %s rows copied in one transaction to %s (recorded for reruns of %s)",
        sql.describe(),
        f"{record['rows']:,}",
        folder,
        run_name,
    )
    return data.as_copy(record)


def _unrecorded_copies(storage_path: str, run_name: str, recorded: Any) -> list[str]:
    """Remove this run name's copy folders that no record names: what a copy killed before its record was written
    left (a copy that fails otherwise removes its own folder). Only folders of this run's copy name
    (`<run>-source-<8 hex>`) holding nothing but copy_to_parquet's `part-NNNNN.parquet` files: never anything else
    in a shared storage; called under the run's lock, so no copy of this run name is being written."""
    import re

    from trainflow.tables.postgres import COPY_FILE_PATTERN
    from trainflow.run.storage import filesystem_for, join, list_dir

    named = re.compile(re.escape(run_name) + r"-source-[0-9a-f]{8}")
    keep = str(recorded.get("location", "")).rstrip("/") if isinstance(recorded, dict) else ""
    removed = []
    try:
        entries = list_dir(storage_path)
    except OSError:
        return removed
    for name, is_dir in entries:
        folder = join(storage_path, name)
        if not is_dir or not named.fullmatch(name) or folder.rstrip("/") == keep:
            continue
        try:
            files = list_dir(folder)
            if not all(not d and re.fullmatch(COPY_FILE_PATTERN, f) for f, d in files):
                continue
            fs, inner = filesystem_for(folder)
            fs.delete_dir(inner)
        except OSError:
            continue
        removed.append(folder)
    return removed


def _same_source(recorded: Any, sql, fmt: str) -> bool:
    """Whether a copy's record names the format fmt, and the server and query of sql (a SqlSource)."""
    return isinstance(recorded, dict) and (recorded.get("format"), recorded.get("server"), recorded.get("query")) == (
        fmt,
        sql.server,
        sql.query,
    )


def recorded_copy(config: Config, run_name: str | None) -> dict[str, Any] | None:
    """The copy of this PostgreSQL source run_name's first attempt made, when its record and files are intact (what
    pin_source would read: the checks before a rerun read it too, without the server); else None."""
    import json

    from trainflow.tables.postgres import SqlSource
    from trainflow.run.storage import join, read_text

    if not run_name or source(config.data.format).kind != "query":
        return None
    try:
        recorded = json.loads(read_text(join(config.storage_path, f"{run_name}{SOURCE_SUFFIX}")))
    except (OSError, ValueError):
        return None
    prefix = join(config.storage_path, f"{run_name}-source-")
    intact = _same_source(recorded, SqlSource.of(config.data), config.data.format) and _copy_intact(recorded, prefix)
    return recorded if intact else None


@contextlib.contextmanager
def throwaway_copy(config: Config) -> Iterator[Config]:
    """config, its PostgreSQL source read into a temporary local copy for the checks of a dry run (validate), which
    records nothing and leaves nothing behind; any other config as it is."""
    if source(config.data.format).kind != "query":
        yield config
        return
    import tempfile

    from trainflow.tables.postgres import SqlSource, copy_to_parquet

    with tempfile.TemporaryDirectory(prefix="trainflow-validate-") as folder:
        record = copy_to_parquet(SqlSource.of(config.data), str(Path(folder) / "copy"))
        yield config.model_copy(update={"data": config.data.as_copy(record)})


def _copy_intact(record: dict, prefix: str) -> bool:
    """Whether a copy's record names a folder of this run's storage whose Parquet files are those it lists, each
    whole (its footer readable, the row counts adding up to the record's)."""
    import re

    import pyarrow.parquet as pq

    from trainflow.tables.postgres import COPY_FILE_PATTERN
    from trainflow.run.storage import filesystem_for

    location, files, rows = record.get("location"), record.get("files"), record.get("rows")
    # exactly <run>-source-<8 hex> and its part-NNNNN.parquet files: nothing through `..`, nothing elsewhere
    own = re.escape(prefix) + r"[0-9a-f]{8}"
    if not (isinstance(location, str) and re.fullmatch(own, location) and isinstance(files, list) and files):
        return False
    mine = re.escape(location) + "/" + COPY_FILE_PATTERN
    if not all(isinstance(f, str) and re.fullmatch(mine, f) for f in files) or not isinstance(rows, int):
        return False
    try:
        fs, _ = filesystem_for(location)
        found = sum(pq.ParquetFile(filesystem_for(f)[1], filesystem=fs).metadata.num_rows for f in files)
    except (OSError, ValueError):
        return False
    return found == rows


def _exists(uri: str) -> bool:
    import pyarrow.fs as pafs

    from trainflow.run.storage import filesystem_for

    fs, inner = filesystem_for(uri)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def _read_files(config: Config, known_fingerprint: str | None):
    """A file table: (rows, files, schema, fingerprint, materialize, bytes, why)."""
    data = config.data
    listed = fs, found = list_files(data.path, data.format)  # once: a remote folder's listing is a request per page
    fp, materialize, table_bytes, why = (
        _fingerprint(data, fs, found) if known_fingerprint is None else (known_fingerprint, *_sizing(data, fs, found))
    )
    # a small Parquet table is read by this process and handed to Ray Data whole (no read tasks, no passes for
    # the checks); a CSV table keeps Ray Data's per-file type inference
    table = (
        read_arrow(fs, found, data.format, data.csv, data.path)
        if (materialize and source(data.format).reads_here and table_bytes <= IN_PROCESS_BYTES)
        else None
    )
    if table is not None:
        return (
            table,
            [with_scheme(data.path, f) for f in found],
            table.schema,
            fp,
            True,
            table_bytes,
            why + "; read by this process",
        )
    ensure_ray(**config.ray_start)
    ds, files, _ = read_table(data.path, data.format, listed=listed, csv=data.csv)
    schema = arrow_schema(ds, data.path)
    if materialize:
        ds = ds.materialize()  # read once; the checks and the split reuse it
    else:
        ds, _, _ = read_table(data.path, data.format, streamed=True, listed=listed, csv=data.csv)
    return ds, files, schema, fp, materialize, table_bytes, why


def _read_snapshot(config: Config, snap: Snapshot):
    """A Delta or Iceberg table at its snapshot: (rows, files, schema, fingerprint, materialize, bytes, why)."""
    data = config.data
    table_bytes = snapshot_bytes(snap)
    materialize, why = should_materialize(data.materialize, table_bytes)
    why = f"{snap.describe()}; {why}"
    if materialize and table_bytes <= IN_PROCESS_BYTES:
        table = snapshot_arrow(data, snap)
        return (
            table,
            list(snap.files),
            table.schema,
            snap.fingerprint,
            True,
            table_bytes,
            why + "; read by this process",
        )
    ensure_ray(**config.ray_start)
    ds = read_dataset(data, snap, **({} if materialize else streamed_read_args()))
    schema = arrow_schema(ds, data.path)
    ds = ds.materialize() if materialize else bounded_blocks(ds)
    return ds, list(snap.files), schema, snap.fingerprint, materialize, table_bytes, why


@task(
    name="ingest", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE
)
def ingest(config: Config, known_fingerprint: str | None = None) -> Ingested:
    """Read and check the training table; compute its content fingerprint (known_fingerprint: table_fingerprint's
    answer for it, not computed again); a Delta or Iceberg table at its snapshot (pin_source's)."""
    config.require_workers()
    if cluster_named(config.ray.address):  # else this process reads a small table without Ray (runtime.nodes)
        ensure_ray(**config.ray_start)
    check_fits(config.scaling.model_dump())  # seconds, not a placement group that waits forever
    data = config.data
    if config.inference.output:  # a place trainflow may write: checked before anything is read
        check_destination(config)
    if source(data.format).kind == "query":  # a flow reads a query's copy (pin_source, throwaway_copy)
        raise DataError(f"{data.where}: not copied yet; a flow reads a PostgreSQL source after pin_source")
    snap = resolve_snapshot(data) if source(data.format).kind == "snapshot" else None
    ds, files, schema, fp, materialize, table_bytes, why = (
        _read_snapshot(config, snap) if snap is not None else _read_files(config, known_fingerprint)
    )
    spec = table_spec(schema, data, config.task, data.path, files=files)
    missing = [c for c in config.promotion.slices if c not in schema.names]
    if missing:
        raise DataError(
            f"{data.path}: promotion.slices names column(s) {missing} that the table lacks; "
            f"columns are {list(schema.names)}"
        )
    task_logger("ingest").info("table %s: %s", "materialized" if materialize else "streamed", why)
    check_text_columns(ds, spec, config.preprocess.parse_dates, data.path)
    if config.inference.input:
        preflight_inference(config, spec, schema)
    rows, bad = count_rows_and_bad_labels(ds, data.label)
    if rows == 0:
        raise DataError(f"{data.path}: the table has no rows")
    if bad:
        raise DataError(
            f"{data.path}: label column {data.label!r} has {bad} missing, NaN or infinite value(s) out of {rows} rows; "
            "drop or fix those rows"
        )
    spec.rows, spec.fingerprint = rows, fp
    spec.snapshot = snap.record() if snap is not None else data.copied_from
    task_logger("ingest").info(
        "read %d rows from %d file(s): %d numeric, %d text, %d date feature(s); fingerprint %s",
        rows,
        len(files),
        len(spec.numeric),
        len(spec.categorical),
        len(spec.dates),
        spec.fingerprint,
    )
    return Ingested(ds, spec, materialize, table_bytes)
