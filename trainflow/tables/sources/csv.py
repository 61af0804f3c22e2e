"""CSV (and TSV) files, parsed with data.csv's dialect; Ray Data infers each file's types."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from trainflow.tables.columns import check_names
from trainflow.tables.sources.base import FileSource


def csv_arguments(csv: Any) -> dict[str, Any]:
    """pyarrow's CSV options for a data.csv section (None: pyarrow's defaults)."""
    if csv is None:
        return {}
    import pyarrow.csv as pacsv

    return {
        "parse_options": pacsv.ParseOptions(delimiter=csv.delimiter, quote_char=csv.quote_char),
        "read_options": pacsv.ReadOptions(encoding=csv.encoding),
    }


class CsvFiles(FileSource):
    name = "csv"
    describes = "CSV files, parsed as `data.csv` says"
    extensions = (".csv", ".tsv")
    reads_here = False  # Ray Data's per-file type inference decides the columns' types

    def file_format(self, csv: Any) -> Any:
        import pyarrow.dataset as pads

        args = csv_arguments(csv)
        return pads.CsvFileFormat(parse_options=args.get("parse_options"), read_options=args.get("read_options"))

    def check_files(self, fs: pafs.FileSystem, first: str, csv: Any, where: str) -> None:
        """The first file's header (and first block) read with the configured dialect: repeated names and text the
        encoding cannot decode are named here, before Ray reads the table."""
        import pyarrow.csv as pacsv

        from trainflow.errors import DataError

        args = csv_arguments(csv)
        try:
            with fs.open_input_stream(first, compression="detect") as stream:
                names = pacsv.open_csv(
                    stream, read_options=args.get("read_options"), parse_options=args.get("parse_options")
                ).schema.names
        except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
            raise DataError(
                f"{where}: cannot read {first} as CSV ({str(exc).splitlines()[0]}); "
                "set data.csv.delimiter / quote_char / encoding to the file's dialect"
            ) from None
        check_names(list(names), where)

    def ray_read(self, files: list[str], fs: pafs.FileSystem, csv: Any, **extra: Any):
        import ray.data

        return ray.data.read_csv(files, filesystem=fs, **csv_arguments(csv), **extra)

    def read_options(self, csv: Any) -> bytes:
        if csv is None:
            return b""
        return json.dumps(csv.model_dump(mode="json") if hasattr(csv, "model_dump") else csv, sort_keys=True).encode()
