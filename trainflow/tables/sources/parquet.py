"""Parquet files: their footers say the schema and the decoded size without a row read."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

from trainflow.tables.sources.base import FileSource


class ParquetFiles(FileSource):
    name = "parquet"
    describes = "Parquet files"
    extensions = (".parquet", ".parq", ".pq")

    def file_format(self, csv: Any) -> Any:
        return "parquet"

    def ray_read(self, files: list[str], fs: pafs.FileSystem, csv: Any, **extra: Any):
        import ray.data

        return ray.data.read_parquet(files, filesystem=fs, **extra)

    def decoded_bytes(self, fs: pafs.FileSystem, inner: str) -> int:
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(fs.open_input_file(inner)).metadata
        return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))

    def metadata(self, fs: pafs.FileSystem, inner: str) -> bytes:
        import pyarrow.parquet as pq

        with fs.open_input_file(inner) as source:
            parquet = pq.ParquetFile(source)
            return str(parquet.schema_arrow).encode() + repr(parquet.metadata.to_dict()).encode()
