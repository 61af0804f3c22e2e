"""Where a training table is read from: one class per format (base.py: files picked by their extension, a table at
one snapshot, a query copied per run), listed in SOURCES. `data.format` is one of its names, and nothing outside this
folder names a format: a new one is one file here and one line below (tests/test_layout.py)."""

from __future__ import annotations

import importlib
from typing import Any

from trainflow.tables.sources.base import FileSource, Source, SnapshotSource
from trainflow.tables.sources.snapshot import Snapshot

# the formats, in the order a table's path is matched against their extensions (the first is the default)
_LISTED = (
    "trainflow.tables.sources.parquet:ParquetFiles",
    "trainflow.tables.sources.csv:CsvFiles",
    "trainflow.tables.sources.delta:DeltaSource",
    "trainflow.tables.sources.iceberg:IcebergSource",
    "trainflow.tables.sources.postgres:PostgresSource",
    "trainflow.tables.sources.orc:OrcFiles",
)


def _load(path: str) -> Source:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)()


SOURCES: dict[str, Source] = {s.name: s for s in map(_load, _LISTED)}
__all__ = ["SOURCES", "FileSource", "Snapshot", "SnapshotSource", "Source", "source", "infer_format"]


def source(fmt: str) -> Any:
    """The source class of a format name (KeyError naming the known ones)."""
    try:
        return SOURCES[fmt]
    except KeyError:
        raise KeyError(f"unknown data format {fmt!r}; the formats are {list(SOURCES)}") from None


def infer_format(path: str) -> str:
    """The file format a path's extension names (compressed or not); folders and globs: the first listed."""
    lower = path.lower().rstrip("/")
    files = [s for s in SOURCES.values() if isinstance(s, FileSource)]
    return next((s.name for s in files if s.has_extension(lower)), files[0].name)


def for_keys(keys: set[str]) -> str | None:
    """The format whose own keys are the ones set (data.sql or data.table: the query source); None for none."""
    return next((s.name for s in SOURCES.values() if s.kind == "query" and keys & set(s.own_keys)), None)


def resolve_snapshot(data: Any, pinned: int | None = None) -> Snapshot:
    """The snapshot a run reads: pinned (an earlier attempt's), else data.snapshot, else the table's current one.
    DataError naming the table and the snapshot when it cannot be read."""
    return source(data.format).resolve(data, pinned)


def read_arrow(data: Any, snap: Snapshot) -> Any:
    """The snapshot's rows read by this process (a small table), through the format's own scan."""
    return source(snap.format).read_arrow(data, snap)


def source_dataset(data: Any, snap: Snapshot | None = None) -> Any:
    """The snapshot a run would read (or snap), or a query, as a pyarrow dataset: its schema and the columns the checks
    before Ray starts read (the label for task inference and its values)."""
    src = source(data.format)
    if src.kind == "query":
        return src.dataset(data)
    return src.dataset(data, snap or src.resolve(data, None))


def read_dataset(data: Any, snap: Snapshot, **extra: Any):
    """The snapshot's rows as a lazy Ray Dataset, through Ray Data's reader of the format (extra: read arguments,
    e.g. a streamed read's tasks and file shuffle)."""
    from trainflow.errors import DataError

    try:
        return source(snap.format).ray_read(data, snap, **extra)
    except Exception as exc:  # noqa: BLE001 - Ray wraps the readers' errors in many types
        raise DataError(f"cannot read {snap.describe()}: {str(exc).splitlines()[0]}") from None


def snapshot_bytes(snap: Snapshot) -> int:
    """The snapshot's size once decoded, from its data files' Parquet footers (no rows read)."""
    from trainflow.run.storage import filesystem_for

    if not snap.files:
        return 0
    fs, _ = filesystem_for(snap.files[0])
    return sum(SOURCES["parquet"].decoded_bytes(fs, filesystem_for(f)[1]) for f in snap.files)
