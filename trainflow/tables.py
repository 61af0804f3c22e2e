"""Tables without Ray: listing a path's data files (pyarrow.fs), their schema, CSV dialect checks, and the task a
label implies. Used by the config (task inference), `trainflow init` and `validate`, and by data.py's Ray reads."""

from __future__ import annotations

import fnmatch
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from trainflow.errors import ConfigError, DataError
from trainflow.storage import filesystem_for

GLOB_CHARS = "*?["


def list_files(path: str, fmt: str) -> tuple[pafs.FileSystem, list[str]]:
    """Expand a file, folder or glob into the sorted data files it names; DataError if none."""
    fs, inner = filesystem_for(path)
    if any(ch in inner for ch in GLOB_CHARS):
        base = inner[: min(inner.find(ch) for ch in GLOB_CHARS if ch in inner)].rsplit("/", 1)[0] or "/"
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, inner)]
        if not files:
            raise DataError(f"data path {path}: the pattern matches no files")
        return fs, sorted(files)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"data path {path}: no such file or folder")
    if info.type == pafs.FileType.File:
        return fs, [inner]
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True))
    files = sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File and not i.base_name.startswith((".", "_")) and has_extension(i.base_name, fmt)
    )
    if not files:
        raise DataError(f"data path {path}: the folder holds no .{fmt} files")
    return fs, files


EXTENSIONS = {"parquet": (".parquet", ".parq", ".pq"), "csv": (".csv", ".tsv")}
COMPRESSED = ("", ".gz", ".bz2", ".zst", ".lz4")


def has_extension(name: str, fmt: str) -> bool:
    """Whether a file in a data folder is one of fmt's by its real extension (parquet_notes.txt is not Parquet)."""
    lower = name.lower()
    return any(lower.endswith(ext + comp) for ext in EXTENSIONS[fmt] for comp in COMPRESSED)


def csv_arguments(csv: Any) -> dict[str, Any]:
    """ray.data.read_csv's pyarrow options for a data.csv section (None: pyarrow's defaults)."""
    if csv is None:
        return {}
    import pyarrow.csv as pacsv

    return {"parse_options": pacsv.ParseOptions(delimiter=csv.delimiter, quote_char=csv.quote_char),
            "read_options": pacsv.ReadOptions(encoding=csv.encoding)}


def check_names(names: list[str], source: str) -> None:
    """DataError when a column name appears more than once (pyarrow would fail later with a KeyError)."""
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DataError(f"{source}: column name(s) {repeated} appear more than once; give every column its own name")


def check_csv_header(fs: pafs.FileSystem, first: str, csv: Any, source: str) -> None:
    """Read the first CSV file's header (and first block) with the configured dialect: repeated names and text
    the encoding cannot decode are named here, before Ray reads the table."""
    import pyarrow.csv as pacsv

    args = csv_arguments(csv)
    try:
        with fs.open_input_stream(first, compression="detect") as stream:
            names = pacsv.open_csv(stream, read_options=args.get("read_options"),
                                   parse_options=args.get("parse_options")).schema.names
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise DataError(f"{source}: cannot read {first} as CSV ({str(exc).splitlines()[0]}); "
                        "set data.csv.delimiter / quote_char / encoding to the file's dialect") from None
    check_names(list(names), source)


def open_dataset(path: str, fmt: str, csv: Any = None):
    """A pyarrow dataset over the table's files (no rows read yet); DataError when they cannot be opened."""
    import pyarrow.dataset as pads

    fs, files = list_files(path, fmt)
    if fmt == "csv":
        check_csv_header(fs, files[0], csv, path)
        args = csv_arguments(csv)
        file_format = pads.CsvFileFormat(parse_options=args.get("parse_options"), read_options=args.get("read_options"))
    else:
        file_format = "parquet"
    try:
        return pads.dataset(files, filesystem=fs, format=file_format)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {path} as {fmt}: {str(exc).splitlines()[0]}") from None


def _type_name(t: pa.DataType) -> str:
    return "text" if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t) else str(t)


def infer_task(path: str, fmt: str, label: str, csv: Any = None, dataset=None) -> tuple[str, str]:
    """(task, why) for a config that leaves `task` out, when the label column leaves no doubt: text or true/false
    labels are classes, fractional numbers a quantity, whole numbers with two values a binary class. Whole numbers
    with more values could be either (ratings, counts): ConfigError asking for `task`."""
    dataset = dataset if dataset is not None else open_dataset(path, fmt, csv)
    if label not in dataset.schema.names:
        raise ConfigError(f"data.label: {label!r} is not a column of {path} (columns: {dataset.schema.names})")
    t = dataset.schema.field(label).type
    if pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return "classification", f"the label {label!r} holds {_type_name(t)} values"
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
        raise ConfigError(f"task: cannot tell it from the label {label!r} of type {t}; set task: classification "
                          "or task: regression")
    values = dataset.to_table(columns=[label]).column(label).drop_null()  # the one column, every row
    if not pa.types.is_integer(t) and len(values) and pc.any(pc.not_equal(values, pc.floor(values))).as_py():
        return "regression", f"the label {label!r} holds fractional numbers"
    distinct = pc.count_distinct(values).as_py()
    if distinct <= 2:
        return "classification", f"the label {label!r} holds {distinct} distinct whole numbers"
    raise ConfigError(f"task: the label {label!r} holds {distinct} distinct whole numbers, which could be classes "
                      "or a quantity; set task: classification or task: regression")
