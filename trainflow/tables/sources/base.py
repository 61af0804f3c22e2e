"""What every source format is: a `Source` names its format, the data.* keys that are its own, and how the config
checks them; a `FileSource` reads files picked by their extension (pyarrow.dataset in this process, Ray Data's reader
beside it); `SnapshotSource` reads a table at one snapshot; a query source is copied once per run. Nothing here
imports Ray: its readers are imported when a table is read."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.fs as pafs

COMPRESSED = ("", ".gz", ".bz2", ".zst", ".lz4")


class Source:
    """One format a training table comes in (data.format)."""

    name: ClassVar[str]
    kind: ClassVar[str]  # "files" (read by extension), "snapshot" (a table at one snapshot), "query" (copied per run)
    own_keys: ClassVar[tuple[str, ...]] = ()  # data.* keys only this format takes
    describes: ClassVar[str] = ""  # the key table's words for it, after its name
    path_is_location: ClassVar[bool] = True  # data.path is a place (resolved against the config's folder), not a name

    def check(self, data: Any) -> None:
        """The config's checks of data for this format (ValueError naming the key), beyond its keys' own."""
        if data.path is None:
            raise ValueError("path: required (a file, folder, glob or URI; or data.sql/data.table on PostgreSQL)")

    def where(self, data: Any) -> str:
        """What messages name the table by."""
        return str(data.path)


class FileSource(Source):
    """Files of one format, picked in a folder by their extension (optionally compressed)."""

    kind = "files"
    extensions: ClassVar[tuple[str, ...]]
    reads_here: ClassVar[bool] = True  # a small table is read by this process, its schema from the files' metadata

    def has_extension(self, name: str) -> bool:
        """Whether a file is one of this format's by its real extension (parquet_notes.txt is not Parquet)."""
        lower = name.lower()
        return any(lower.endswith(ext + comp) for ext in self.extensions for comp in COMPRESSED)

    def file_format(self, csv: Any) -> Any:
        """pyarrow.dataset's format for these files (csv: the config's data.csv section)."""
        raise NotImplementedError

    def check_files(self, fs: pafs.FileSystem, first: str, csv: Any, where: str) -> None:
        """Checks of the first file before its rows are read (DataError naming it)."""

    def ray_read(self, files: list[str], fs: pafs.FileSystem, csv: Any, **extra: Any):
        """A lazy Ray Dataset over files, through Ray Data's reader of the format."""
        raise NotImplementedError

    def decoded_bytes(self, fs: pafs.FileSystem, inner: str) -> int:
        """A file's size once decoded, from its metadata where it has one (the file's size otherwise)."""
        return fs.get_file_info(inner).size or 0

    def metadata(self, fs: pafs.FileSystem, inner: str) -> bytes:
        """What a file's metadata says of its content (its schema, its row groups), for a fingerprint from metadata."""
        return b""

    def read_options(self, csv: Any) -> bytes:
        """How the files are decoded, as bytes hashed into the fingerprint (the same bytes, other columns)."""
        return b""


class SnapshotSource(Source):
    """A table kept in a table format, read at one snapshot (trainflow/tables/sources/snapshot.py)."""

    kind = "snapshot"
    own_keys = ("snapshot",)
    version_word: ClassVar[str] = "snapshot"  # what the format calls a snapshot

    def resolve(self, data: Any, pinned: int | None) -> Any:
        """The Snapshot a run reads: pinned, else data.snapshot, else the current one."""
        raise NotImplementedError

    def read_arrow(self, data: Any, snap: Any) -> pa.Table:
        """The snapshot's rows read by this process (a small table)."""
        raise NotImplementedError

    def dataset(self, data: Any, snap: Any) -> Any:
        """The snapshot as the pyarrow dataset calls of the checks (its schema, columns read alone)."""
        raise NotImplementedError

    def ray_read(self, data: Any, snap: Any, **extra: Any):
        """The snapshot's rows as a lazy Ray Dataset."""
        raise NotImplementedError
