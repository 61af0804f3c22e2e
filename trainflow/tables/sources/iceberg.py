"""An Apache Iceberg table of a pyiceberg catalog (data.catalog; SQLite's SQL catalog by default) at one snapshot id,
read through pyiceberg's scan (a small table) or Ray Data's read_iceberg, so delete files and schema changes apply
as Iceberg defines them."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from trainflow.errors import DataError
from trainflow.tables.sources.base import SnapshotSource
from trainflow.tables.sources.snapshot import Snapshot

DEFAULT_CATALOG = {"type": "sql"}  # pyiceberg's SQL catalog (SQLite by default): the embedded one


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


class _IcebergScan:
    """An Iceberg snapshot as the pyarrow dataset calls the checks make of a table: its schema, and the columns
    they read (one scan of those columns)."""

    def __init__(self, table, snapshot_id: int):
        self.table, self.snapshot_id = table, snapshot_id
        self.schema = table.schema().as_arrow()

    def to_table(self, columns: list[str] | None = None) -> pa.Table:
        fields = tuple(columns) if columns else ("*",)
        return self.table.scan(snapshot_id=self.snapshot_id, selected_fields=fields).to_arrow()


class IcebergSource(SnapshotSource):
    name = "iceberg"
    describes = "an Apache Iceberg table of `data.catalog`, named by its identifier, read at one snapshot"
    own_keys = ("snapshot", "catalog")
    path_is_location = False  # its identifier in the catalog

    def check(self, data: Any) -> None:
        super().check(data)
        if "/" in data.path:
            raise ValueError(
                f"path: {data.path!r}: an Iceberg table is named by its identifier in data.catalog, "
                "e.g. `analytics.orders`, not a path"
            )

    def resolve(self, data: Any, pinned: int | None) -> Snapshot:
        wanted = pinned if pinned is not None else data.snapshot
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
        return Snapshot(
            self.name,
            data.path,
            int(wanted),
            str(table.metadata.table_uuid),
            table.location(),
            files,
            self.version_word,
        )

    def read_arrow(self, data: Any, snap: Snapshot) -> pa.Table:
        return _iceberg_table(data).scan(snapshot_id=snap.snapshot).to_arrow()

    def dataset(self, data: Any, snap: Snapshot) -> Any:
        return _IcebergScan(_iceberg_table(data), snap.snapshot)

    def ray_read(self, data: Any, snap: Snapshot, **extra: Any):
        import ray.data

        extra.pop("shuffle", None)  # read_iceberg reads its planned files in order
        extra.pop("concurrency", None)
        props = {**DEFAULT_CATALOG, **(data.catalog or {})}
        return ray.data.read_iceberg(
            table_identifier=data.path, snapshot_id=snap.snapshot, catalog_kwargs={"name": "default", **props}, **extra
        )
