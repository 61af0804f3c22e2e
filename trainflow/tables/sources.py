"""Tables kept in a table format, read at one snapshot: Delta Lake (a table folder, local or any URI the project reads,
its version) and Apache Iceberg (a table of a pyiceberg catalog, its snapshot id). A run reads the snapshot that was
current when it started, or the one data.snapshot names; a rerun of the same run name reads the one its first attempt
recorded, so a table that grew in between is read as it was and the run resumes. The fingerprint of a snapshot is its
identity (the table's own id, the snapshot), taken from the table's log or metadata, never from a pass over its
rows. The rows are read through Ray Data's own readers (read_delta, read_iceberg), or by this process through the
libraries' own scans for a small table, so deletion vectors, delete files and schema changes are applied as the
formats define them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from trainflow.errors import DataError

SNAPSHOT_FORMATS = ("delta", "iceberg")
SOURCE_FORMATS = (*SNAPSHOT_FORMATS, "postgres")  # tables that are not files (their own readers, their own checks)
DEFAULT_CATALOG = {"type": "sql"}  # pyiceberg's SQL catalog (SQLite by default): the embedded one


@dataclass(frozen=True)
class Snapshot:
    """One snapshot of a table: what a run read, recorded in its summary, MLflow and the model version's tags."""

    format: str  # delta or iceberg
    table: str  # the Delta table's location, or the Iceberg table's identifier
    snapshot: int  # the Delta version, or the Iceberg snapshot id
    table_id: str  # the table's own id (a table dropped and made again under the same name is another table)
    location: str  # where its files are (the Iceberg table's location; the Delta table's)
    files: tuple[str, ...]  # its data files (their Parquet footers size the table)

    @property
    def fingerprint(self) -> str:
        ident = json.dumps([self.format, self.table_id, self.snapshot])
        return "snapshot:" + hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()

    def record(self) -> dict[str, Any]:
        """What the summary, MLflow and the registry record of it (its files left out)."""
        return {k: v for k, v in asdict(self).items() if k != "files"}

    def describe(self) -> str:
        what = "version" if self.format == "delta" else "snapshot"
        return f"{self.format} table {self.table} at {what} {self.snapshot}"


def _catalog(properties: dict[str, Any] | None):
    try:
        from pyiceberg.catalog import load_catalog
    except ModuleNotFoundError:
        raise DataError("data.format iceberg needs pyiceberg: pip install 'trainflow[lakehouse]'") from None
    props = {**DEFAULT_CATALOG, **(properties or {})}
    name = str(props.pop("name", "default"))
    try:
        return load_catalog(name, **props)
    except Exception as exc:  # noqa: BLE001 - pyiceberg raises per catalog kind
        raise DataError(f"data.catalog: cannot open the Iceberg catalog {name!r}: {str(exc).splitlines()[0]}") from None


def _iceberg_table(data):
    from pyiceberg.exceptions import NoSuchTableError

    catalog = _catalog(data.catalog)
    try:
        return catalog.load_table(data.path)
    except NoSuchTableError:
        raise DataError(f"data.path: the Iceberg catalog has no table {data.path!r}") from None
    except Exception as exc:  # noqa: BLE001 - a malformed identifier, an unreachable catalog
        raise DataError(f"data.path: cannot load the Iceberg table {data.path!r}: {str(exc).splitlines()[0]}") from None


def _delta_table(path: str, version: int | None):
    try:
        from deltalake import DeltaTable
    except ModuleNotFoundError:
        raise DataError("data.format delta needs the deltalake package: pip install 'trainflow[lakehouse]'") from None
    try:
        return DeltaTable(path, version=version)
    except Exception as exc:  # noqa: BLE001 - TableNotFoundError, a version that does not exist, storage errors
        first = str(exc).splitlines()[0]
        if version is not None:
            raise DataError(f"{path}: the Delta table has no version {version} ({first})") from None
        raise DataError(f"{path}: not a Delta table that can be read ({first})") from None


def resolve_snapshot(data, pinned: int | None = None) -> Snapshot:
    """The snapshot a run reads: pinned (an earlier attempt's), else data.snapshot, else the table's current one.
    DataError naming the table and the snapshot when it cannot be read."""
    wanted = pinned if pinned is not None else data.snapshot
    if data.format == "delta":
        table = _delta_table(data.path, wanted)
        return Snapshot(
            "delta",
            data.path,
            int(table.version()),
            str(table.metadata().id),
            data.path,
            tuple(table.file_uris()),
        )
    table = _iceberg_table(data)
    if wanted is None:
        current = table.current_snapshot()
        if current is None:
            raise DataError(f"{data.path}: the Iceberg table has no snapshot (no rows were ever written)")
        wanted = current.snapshot_id
    elif table.snapshot_by_id(wanted) is None:
        known = [s.snapshot_id for s in table.snapshots()][-5:]
        raise DataError(f"{data.path}: the Iceberg table has no snapshot {wanted} (its latest: {known})")
    files = tuple(task.file.file_path for task in table.scan(snapshot_id=wanted).plan_files())
    return Snapshot("iceberg", data.path, int(wanted), str(table.metadata.table_uuid), table.location(), files)


def read_arrow(data, snap: Snapshot) -> pa.Table:
    """The snapshot's rows read by this process (a small table), through the format's own scan."""
    if snap.format == "delta":
        return _delta_table(data.path, snap.snapshot).to_pyarrow_table()
    return _iceberg_table(data).scan(snapshot_id=snap.snapshot).to_arrow()


class _IcebergScan:
    """An Iceberg snapshot as the pyarrow dataset calls the checks make of a table: its schema, and the columns
    they read (one scan of those columns)."""

    def __init__(self, table, snapshot_id: int):
        self.table, self.snapshot_id = table, snapshot_id
        self.schema = table.schema().as_arrow()

    def to_table(self, columns: list[str] | None = None) -> pa.Table:
        fields = tuple(columns) if columns else ("*",)
        return self.table.scan(snapshot_id=self.snapshot_id, selected_fields=fields).to_arrow()


def source_dataset(data, snap: Snapshot | None = None):
    """The snapshot a run would read (or snap) as a pyarrow dataset: its schema and the columns the checks before
    Ray starts read (the label for task inference and its values); a PostgreSQL source's query the same way."""
    if data.format == "postgres":
        from trainflow.tables.postgres import SqlScan, SqlSource

        return SqlScan(SqlSource.of(data))
    snap = snap or resolve_snapshot(data)
    if snap.format == "delta":
        return _delta_table(data.path, snap.snapshot).to_pyarrow_dataset()
    return _IcebergScan(_iceberg_table(data), snap.snapshot)


def read_dataset(data, snap: Snapshot, **extra: Any):
    """The snapshot's rows as a lazy Ray Dataset, through Ray Data's reader of the format (extra: read arguments,
    e.g. a streamed read's tasks and file shuffle)."""
    import ray.data

    try:
        if snap.format == "delta":
            return ray.data.read_delta(data.path, version=snap.snapshot, **extra)
        extra.pop("shuffle", None)  # read_iceberg reads its planned files in order
        extra.pop("concurrency", None)
        props = {**DEFAULT_CATALOG, **(data.catalog or {})}
        return ray.data.read_iceberg(
            table_identifier=data.path, snapshot_id=snap.snapshot, catalog_kwargs={"name": "default", **props}, **extra
        )
    except Exception as exc:  # noqa: BLE001 - Ray wraps the readers' errors in many types
        raise DataError(f"cannot read {snap.describe()}: {str(exc).splitlines()[0]}") from None


def snapshot_bytes(snap: Snapshot) -> int:
    """The snapshot's size once decoded, from its data files' Parquet footers (no rows read)."""
    from trainflow.run.storage import filesystem_for
    from trainflow.tables.files import in_memory_bytes

    if not snap.files:
        return 0
    fs, _ = filesystem_for(snap.files[0])
    return in_memory_bytes(fs, [filesystem_for(f)[1] for f in snap.files], "parquet")
