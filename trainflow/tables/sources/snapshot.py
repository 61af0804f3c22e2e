"""One snapshot of a table kept in a table format (Delta Lake, Apache Iceberg: snapshot sources, base.SnapshotSource).

A run reads the snapshot that was current when it started, or the one data.snapshot names; a rerun of the same run
name reads the one its first attempt recorded, so a table that grew in between is read as it was and the run resumes.
The fingerprint of a snapshot is its identity (the table's own id, the snapshot), taken from the table's log or
metadata, never from a pass over its rows."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Snapshot:
    """One snapshot of a table: what a run read, recorded in its summary, MLflow and the model version's tags."""

    format: str  # the source format's name
    table: str  # the Delta table's location, or the Iceberg table's identifier
    snapshot: int  # the Delta version, or the Iceberg snapshot id
    table_id: str  # the table's own id (a table dropped and made again under the same name is another table)
    location: str  # where its files are (the Iceberg table's location; the Delta table's)
    files: tuple[str, ...]  # its data files (their Parquet footers size the table)
    word: str = field(default="snapshot", compare=False)  # what the format calls a snapshot (Delta: version)

    @property
    def fingerprint(self) -> str:
        ident = json.dumps([self.format, self.table_id, self.snapshot])
        return "snapshot:" + hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()

    def record(self) -> dict[str, Any]:
        """What the summary, MLflow and the registry record of it (its files left out)."""
        return {k: v for k, v in asdict(self).items() if k not in ("files", "word")}

    def describe(self) -> str:
        return f"{self.format} table {self.table} at {self.word} {self.snapshot}"
