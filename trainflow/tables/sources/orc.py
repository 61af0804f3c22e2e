"""Apache ORC files: pyarrow reads them in this process, Ray Data's read_orc beside it; a file's decoded size is its
rows times the decoded bytes per row of one stripe of that schema (ORC's footer keeps no uncompressed size)."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

from trainflow.tables.sources.base import FileSource


_ROW_BYTES: dict[
    str, float
] = {}  # decoded bytes per row, by schema (the sizing asks once per file, several times a run)


class OrcFiles(FileSource):
    name = "orc"
    describes = "Apache ORC files"
    extensions = (".orc",)

    def file_format(self, csv: Any) -> Any:
        return "orc"

    def ray_read(self, files: list[str], fs: pafs.FileSystem, csv: Any, **extra: Any):
        import ray.data

        return ray.data.read_orc(files, filesystem=fs, **extra)

    def decoded_bytes(self, fs: pafs.FileSystem, inner: str) -> int:
        import pyarrow.orc as orc

        with fs.open_input_file(inner) as source:
            f = orc.ORCFile(source)
            if not f.nrows or not f.nstripes:
                return 0
            key = str(f.schema)
            if key not in _ROW_BYTES:  # one stripe decoded per schema: a table's files share it
                first = f.read_stripe(0)
                _ROW_BYTES[key] = first.nbytes / max(first.num_rows, 1)
            return int(_ROW_BYTES[key] * f.nrows)

    def metadata(self, fs: pafs.FileSystem, inner: str) -> bytes:
        import pyarrow.orc as orc

        with fs.open_input_file(inner) as source:
            f = orc.ORCFile(source)
            return f"{f.schema}|{f.nrows}|{f.nstripes}|{f.content_length}".encode()
