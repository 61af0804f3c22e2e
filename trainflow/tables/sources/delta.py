"""A Delta Lake table (a folder, local or at any URI the project reads) at one version, read through deltalake's scan
(a small table) or Ray Data's read_delta, so deletion vectors and schema changes apply as Delta defines them."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from trainflow.errors import DataError
from trainflow.tables.sources.base import SnapshotSource
from trainflow.tables.sources.snapshot import Snapshot


def delta_table(path: str, version: int | None):
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


class DeltaSource(SnapshotSource):
    name = "delta"
    describes = "a Delta Lake table's folder, read at one version"
    version_word = "version"

    def resolve(self, data: Any, pinned: int | None) -> Snapshot:
        table = delta_table(data.path, pinned if pinned is not None else data.snapshot)
        return Snapshot(
            self.name,
            data.path,
            int(table.version()),
            str(table.metadata().id),
            data.path,
            tuple(table.file_uris()),
            self.version_word,
        )

    def read_arrow(self, data: Any, snap: Snapshot) -> pa.Table:
        return delta_table(data.path, snap.snapshot).to_pyarrow_table()

    def dataset(self, data: Any, snap: Snapshot) -> Any:
        return delta_table(data.path, snap.snapshot).to_pyarrow_dataset()

    def ray_read(self, data: Any, snap: Snapshot, **extra: Any):
        import ray.data

        return ray.data.read_delta(data.path, version=snap.snapshot, **extra)
