"""Apache ORC files: pyarrow reads them in this process, Ray Data's read_orc beside it; a file's decoded size is its
first stripe's, decoded, scaled to the file's rows (ORC's footer keeps no uncompressed size)."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

from trainflow.tables.sources.base import FileSource


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
            first = f.read_stripe(0)
            return int(first.nbytes * f.nrows / max(first.num_rows, 1))

    def metadata(self, fs: pafs.FileSystem, inner: str) -> bytes:
        import pyarrow.orc as orc

        with fs.open_input_file(inner) as source:
            f = orc.ORCFile(source)
            return f"{f.schema}|{f.nrows}|{f.nstripes}|{f.content_length}".encode()
