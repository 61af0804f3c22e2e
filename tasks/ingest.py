"""Task: read the table with Ray Data, check its columns and labels, fingerprint it."""

from __future__ import annotations


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
from trainflow.sources import (
    SNAPSHOT_FORMATS,
    Snapshot,
    read_arrow as snapshot_arrow,
    read_dataset,
    resolve_snapshot,
    snapshot_bytes,
)
from trainflow.preprocessors.fit import check_text_columns
from trainflow.tables import (
    IN_PROCESS_BYTES,
    TableSpec,
    check_writable,
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
from trainflow.storage import with_scheme
from trainflow.errors import DataError
from trainflow.outputs import guard_output
from trainflow.trainer.resources import check_fits
from trainflow.runtime import cluster_named, ensure_ray
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
    fs, files = list_files(inp, fmt)
    here = fmt == "parquet"  # its footers say the schema, and the id column is read alone: no Ray pass at any size
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
    if config.data.format in SNAPSHOT_FORMATS:
        return resolve_snapshot(config.data).fingerprint
    if cluster_named(config.ray.address):  # its object store's size decides content or metadata
        ensure_ray(**config.ray_start)
    fs, files = list_files(config.data.path, config.data.format)
    return _fingerprint(config.data, fs, files)[0]


@task(name="pin-source", cache_policy=NO_CACHE)
def pin_source(config: Config, run_name: str) -> Config:
    """A Delta or Iceberg table's snapshot for this run name: the one its first attempt recorded in storage (a rerun
    or a resume reads what it read, however the table grew since), else data.snapshot or the table's current one,
    recorded now. A record naming another table is not trusted: the run reads the table's current snapshot."""
    import json

    from trainflow.storage import is_uri, join, read_text, replace_bytes, write_new

    data = config.data
    if data.format not in SNAPSHOT_FORMATS:
        return config
    log = task_logger("pin-source")
    record_uri = join(config.storage_path, f"{run_name}{SOURCE_SUFFIX}")
    try:
        recorded = json.loads(read_text(record_uri))
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, dict) and (recorded.get("format"), recorded.get("table")) == (data.format, data.path):
        pinned = recorded.get("snapshot")
        if isinstance(pinned, int) and (data.snapshot is None or data.snapshot == pinned):
            snap = resolve_snapshot(data, pinned)
            if snap.table_id == recorded.get("table_id"):
                log.info("%s: what run %s read first (%s)", snap.describe(), run_name, record_uri)
                return config.model_copy(update={"data": data.model_copy(update={"snapshot": snap.snapshot})})
        log.warning("%s names another table or snapshot than this run reads; not followed", record_uri)
    snap = resolve_snapshot(data)
    body = json.dumps(snap.record()).encode()
    try:
        if not is_uri(record_uri):
            write_new(record_uri, body)  # whole, and never over a file that appeared meanwhile
        elif recorded is None and not _exists(record_uri):  # object stores: the run lock serializes this name
            replace_bytes(record_uri, body)
    except FileExistsError:
        pass  # another record is there (not followed, above): this run reads its own snapshot
    log.info("%s (recorded for reruns of %s)", snap.describe(), run_name)
    return config.model_copy(update={"data": data.model_copy(update={"snapshot": snap.snapshot})})


def _exists(uri: str) -> bool:
    import pyarrow.fs as pafs

    from trainflow.storage import filesystem_for

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
        if (materialize and data.format == "parquet" and table_bytes <= IN_PROCESS_BYTES)
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
        guard_output(config.inference.output, config)
        check_writable(config.inference.output)
    snap = resolve_snapshot(data) if data.format in SNAPSHOT_FORMATS else None
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
    spec.snapshot = snap.record() if snap is not None else None
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
