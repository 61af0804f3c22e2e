"""Tables without Ray: listing a path's data files (pyarrow.fs), their schema and sizes, the column checks and
kinds, the fingerprint, the task a label implies, and whether an output location is writable. Used by the config
(task inference), `trainflow init`, ingest and inference, and by data.py's Ray Data reads."""

from __future__ import annotations

import fnmatch
import difflib
import hashlib
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from trainflow.errors import ConfigError, DataError
from trainflow.run.storage import filesystem_for, is_uri
from trainflow.tables.columns import check_names


GLOB_CHARS = "*?["


def source(fmt: str):
    """The source format fmt names (trainflow/tables/sources/; imported when a table is read: what a registered model
    ships of this module, its column kinds, needs none of them)."""
    from trainflow.tables.sources import source as named

    return named(fmt)


INFERENCE_INPUT = "inference.input"  # how list_files' errors name the scoring table


def list_files(path: str, fmt: str, what: str = "data path") -> tuple[pafs.FileSystem, list[str]]:
    """Expand a file, folder or glob into the sorted data files it names; DataError if none, naming the path as
    `what` (data.path's table, or another: a monitor's labels). An object store that does not answer is waited for
    (services.storage_wait_s)."""
    if is_uri(path):
        from trainflow.run.services import patient_storage

        return patient_storage(lambda: _list_files(path, fmt, what), path)
    return _list_files(path, fmt, what)


def _other_files(path: str, infos: list[pafs.FileInfo], fmt: str) -> str:
    """What else a folder holds that another file format reads (the hint after "no .parquet files")."""
    from trainflow.tables.sources import SOURCES, FileSource

    names = [i.base_name for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith((".", "_"))]
    other = [s for s in SOURCES.values() if isinstance(s, FileSource) and s.name != fmt]
    found = next((s for s in other if any(s.has_extension(n) for n in names)), None)
    if found is None:
        return ""
    return f" (it holds {found.name} files: `{path.rstrip('/')}/*{found.extensions[0]}` names them, or data.format: {found.name})"


def _list_files(path: str, fmt: str, what: str = "data path") -> tuple[pafs.FileSystem, list[str]]:
    fs, inner = filesystem_for(path)
    if any(ch in inner for ch in GLOB_CHARS):
        base = inner[: min(inner.find(ch) for ch in GLOB_CHARS if ch in inner)].rsplit("/", 1)[0] or "/"
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, inner)]
        if not files:
            raise DataError(f"{what} {path}: the pattern matches no files")
        return fs, sorted(files)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"{what} {path}: no such file or folder")
    if info.type == pafs.FileType.File:
        return fs, [inner]
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True))
    names = {i.path.removeprefix(inner.rstrip("/") + "/") for i in infos}
    if "_delta_log" in names:  # its Parquet files hold rows the table has removed since
        raise DataError(f"{what} {path}: a Delta table; read it as one (data.format: delta)")
    if "metadata" in names and any(n.startswith("metadata/") and n.endswith(".metadata.json") for n in names):
        raise DataError(f"{what} {path}: an Iceberg table's folder; read it through its catalog (data.format: iceberg)")
    files_of = source(fmt)
    files = sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File
        and not i.base_name.startswith((".", "_"))
        and files_of.has_extension(i.base_name)
    )
    if not files:
        raise DataError(f"{what} {path}: the folder holds no .{fmt} files{_other_files(path, infos, fmt)}")
    return fs, files


# A table up to this size (decoded) is read, checked and scored by the calling process: below it, starting a Ray task
# or a predictor actor (a worker process importing torch, then loading the model) costs more than the work (figures in
# docs/performance.md, skip-unchanged and front-door).
IN_PROCESS_BYTES = 64 * 2**20
# a scoring table (predict, the retrain's inference) this process reads and predicts itself, a batch at a time: up
# to 512 MiB decoded, or an eighth of the machine's memory where that is less; larger ones go to Ray Data's actors
SCORING_IN_PROCESS_BYTES = 512 * 2**20


def scoring_in_process_bytes() -> int:
    """The largest scoring table (decoded bytes) the calling process predicts itself (SCORING_IN_PROCESS_BYTES)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf: the smaller rule
        return IN_PROCESS_BYTES
    return max(IN_PROCESS_BYTES, min(SCORING_IN_PROCESS_BYTES, memory // 8))


def read_arrow(fs: pafs.FileSystem, files: list[str], fmt: str, csv: Any, where: str) -> pa.Table:
    """A small table read whole into this process with pyarrow.dataset, its files in order (the in-process
    scoring path: no Ray task)."""
    import pyarrow.dataset as pads

    inner = [f.split("://", 1)[1] if is_uri(f) else f for f in files]
    files_of = source(fmt)
    files_of.check_files(fs, inner[0], csv, where)
    try:
        table = pads.dataset(inner, filesystem=fs, format=files_of.file_format(csv)).to_table()
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {where} as {fmt}: {str(exc).splitlines()[0]}") from None
    if not table.schema.names:
        raise DataError(f"{where}: the table is empty (no columns)")
    check_names(list(table.schema.names), where)
    return table


def open_dataset(path: str, fmt: str, csv: Any = None, listed: tuple[pafs.FileSystem, list[str]] | None = None):
    """A pyarrow dataset over the table's files (listed: list_files' answer when the caller has it; no rows read
    yet); DataError when they cannot be opened."""
    import pyarrow.dataset as pads

    fs, files = listed or list_files(path, fmt)
    files_of = source(fmt)
    files_of.check_files(fs, files[0], csv, path)
    try:
        return pads.dataset(files, filesystem=fs, format=files_of.file_format(csv))
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {path} as {fmt}: {str(exc).splitlines()[0]}") from None


def table_dataset(data: Any, snap: Any = None):
    """The table data (the config's data section) names as a pyarrow dataset, its rows not read yet: its files, a
    table at a snapshot (snap, else the one a run would read) or a query (its schema, the columns the checks read)."""
    from trainflow.tables.sources import source_dataset

    if source(data.format).kind == "files":
        return open_dataset(data.path, data.format, data.csv)
    return source_dataset(data, snap)


def _type_name(t: pa.DataType) -> str:
    return "text" if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t) else str(t)


def infer_task(path: str, fmt: str, label: str, csv: Any = None, dataset=None) -> tuple[str, str]:
    """(task, why) for a config that leaves `task` out, when the label column leaves no doubt: text or true/false
    labels are classes, fractional numbers a quantity, whole numbers with two values a binary class. Whole numbers
    with more values could be either (ratings, counts): ConfigError asking for `task`. The answer is kept per
    version of the files (names, sizes, modification times): the CLI's config check and the flow's own load in the
    same process read the label column once."""
    if dataset is not None:
        return _task_of_label(dataset, path, label)
    fs, files = list_files(path, fmt)
    stamp = tuple((f, i.size, i.mtime_ns) for f, i in zip(files, fs.get_file_info(files)))
    key = (path, fmt, label, None if csv is None else (csv.delimiter, csv.quote_char, csv.encoding), stamp)
    if key not in _inferred:
        _inferred[key] = _task_of_label(open_dataset(path, fmt, csv), path, label)
    return _inferred[key]


_inferred: dict[tuple, tuple[str, str]] = {}  # infer_task's answers in this process, by files' version


def _task_of_label(dataset, path: str, label: str) -> tuple[str, str]:
    if label not in dataset.schema.names:
        names = dataset.schema.names
        raise ConfigError(
            f"data.label: {label!r} is not a column of {path}; {did_you_mean(label, names)}columns: {names}"
        )
    t = dataset.schema.field(label).type
    if pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return "classification", f"the label {label!r} holds {_type_name(t)} values"
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
        raise ConfigError(
            f"task: cannot tell it from the label {label!r} of type {t}; set task: classification or task: regression"
        )
    column = dataset.to_table(columns=[label]).column(label)  # the one column, every row
    values = column.drop_null()
    if not len(column):  # nothing to tell the task from, nor to train on: said as the checks before training say it
        raise ConfigError(f"{path}: the table has no rows")
    if not len(values):
        raise ConfigError(
            f"{path}: label column {label!r} has no value in any of its {len(column)} rows: nothing to train on, "
            "nor to tell the task from"
        )
    if not pa.types.is_integer(t) and len(values) and pc.any(pc.not_equal(values, pc.floor(values))).as_py():
        return "regression", f"the label {label!r} holds fractional numbers"
    distinct = pc.count_distinct(values).as_py()
    if distinct <= 2:
        return "classification", f"the label {label!r} holds {distinct} distinct whole numbers"
    raise ConfigError(
        f"task: the label {label!r} holds {distinct} distinct whole numbers, which could be classes "
        "or a quantity; set task: classification or task: regression"
    )


def is_numeric_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t)


def is_string_type(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return is_string_type(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def is_temporal_type(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t)


def in_memory_bytes(fs: pafs.FileSystem, files: list[str], fmt: str) -> int:
    """The table's size once decoded, from file metadata only, as its source format reads it (Parquet: row groups'
    uncompressed sizes; CSV: the files' sizes, text taking at least as much room as the values it encodes)."""
    files_of = source(fmt)
    total = 0
    for f in files:
        try:
            total += files_of.decoded_bytes(fs, f.split("://", 1)[1] if is_uri(f) else f)
        except (pa.ArrowInvalid, OSError) as exc:  # a file that is not what its extension says, or cut short
            raise DataError(f"{f}: cannot read it as {fmt} ({str(exc).splitlines()[0]})") from None
    return total


def fingerprint(
    fs: pafs.FileSystem, files: list[str], content: bool = True, fmt: str = "parquet", csv: Any = None
) -> str:
    """A hash of the input files and how they are read, prefixed by what it covers; computed from the files alone
    (no Ray read), so a retrain tells an unchanged table before starting anything.

    content=True ("content:"): every byte of every file, so the same bytes give the same fingerprint.
    content=False ("metadata:"), for a table streamed because it is larger than the object store: each file's
    name, size and modification time, and a Parquet file's footer (schema, row groups, sizes, column statistics), so
    a table of many GiB, or one on a remote filesystem, is not read once more in full just to name it.
    A CSV table's data.csv options are hashed too: they decide the columns and types its bytes decode to.
    """
    h = hashlib.blake2b(digest_size=16)
    files_of = source(fmt)
    h.update(fmt.encode())
    h.update(files_of.read_options(csv))
    for f in files:
        inner = f.split("://", 1)[1] if is_uri(f) else f  # the path inside fs, as list_files found it
        h.update(inner.rsplit("/", 1)[-1].encode())
        if not content:
            info = fs.get_file_info(inner)
            h.update(f"{info.size}:{info.mtime_ns}".encode())
            h.update(files_of.metadata(fs, inner))
            continue
        with fs.open_input_stream(inner) as stream:
            while chunk := stream.read(8 << 20):
                h.update(chunk)
    return ("content:" if content else "metadata:") + h.hexdigest()


@dataclass
class TableSpec:
    """What ingest learned about a table: its columns by kind and its size."""

    path: str
    files: list[str]
    label: str
    id_column: str | None
    numeric: list[str] = field(default_factory=list)
    categorical: list[str] = field(default_factory=list)
    dates: list[str] = field(default_factory=list)
    rows: int = 0
    fingerprint: str = ""
    feature_order: list[str] = field(default_factory=list)
    mlflow_types: dict[str, str] = field(default_factory=dict)  # feature or label column -> MLflow ColSpec type
    snapshot: dict[str, Any] | None = None  # a Delta or Iceberg table's snapshot read (sources.Snapshot.record)


def mlflow_type(t: pa.DataType) -> str:
    """The MLflow signature type of an arrow column type."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "long"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "double"
    if is_temporal_type(t):
        return "datetime"
    return "string"


_DELIMITERS = {";": "';'", "\t": '"\\t"', "|": "'|'"}  # other CSV delimiters, as a config writes them


def did_you_mean(name: object, names: list[str]) -> str:
    """ "did you mean 'x'? " naming the closest of names to a misspelled name, or nothing; where the names are one
    CSV header read whole (its values separated by another character than data.csv.delimiter), that setting."""
    if len(names) == 1 and str(name) in str(names[0]):
        for char, written in _DELIMITERS.items():
            if char in str(names[0]):
                return f"the header reads as one column: if {written} separates its values, set data.csv.delimiter: {written}; "
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def check_present(names: list[str], data: Any, source: str) -> None:
    """The label, id and feature columns data names are among names (DataError naming the first missing one)."""
    for role, col in (("label", data.label), ("id", data.id_column)):
        if col is not None and col not in names:
            raise DataError(f"{source}: {role} column {col!r} not found; {did_you_mean(col, names)}columns are {names}")
    missing = [c for c in (data.features or []) if c not in names]
    if missing:
        raise DataError(
            f"{source}: feature column(s) {missing} not found; {did_you_mean(missing[0], names)}columns are {names}"
        )


def check_columns(
    schema: pa.Schema, data: Any, task: str, source: str
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Check label/feature/id columns exist with usable types; return (features, numeric, categorical, dates)."""
    names = list(schema.names)
    check_present(names, data, source)
    features = data.default_features(names)
    if not features:
        raise DataError(f"{source}: no feature columns left besides the label and id")
    numeric, categorical, dates = [], [], []
    for col in features:
        t = schema.field(col).type
        if is_numeric_type(t):
            numeric.append(col)
        elif is_string_type(t):
            categorical.append(col)
        elif is_temporal_type(t):
            dates.append(col)
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            raise DataError(
                f"{source}: column {col!r} holds text that is not UTF-8; set data.csv.encoding to the "
                "file's encoding (e.g. latin-1, cp1252)"
            )
        else:
            raise DataError(
                f"{source}: feature column {col!r} has type {t}, which is neither numeric, text nor a date; "
                "list the usable columns under data.features"
            )
    lt = schema.field(data.label).type
    if task == "regression" and not is_numeric_type(lt):
        raise DataError(f"{source}: label column {data.label!r} has type {lt}; regression needs a numeric label")
    if task == "classification" and not (is_numeric_type(lt) or is_string_type(lt)):
        raise DataError(f"{source}: label column {data.label!r} has type {lt}; classification needs numbers or text")
    return features, numeric, categorical, dates


def table_spec(schema: pa.Schema, data: Any, task: str, source: str, files: list[str] | None = None) -> TableSpec:
    """Check the table's columns (check_columns) and describe them: kinds, order and MLflow signature types.

    rows and fingerprint stay 0/"" until ingest has read the data.
    """
    features, numeric, categorical, dates = check_columns(schema, data, task, source)
    return TableSpec(
        path=source,
        files=files or [],
        label=data.label,
        id_column=data.id_column,
        numeric=numeric,
        categorical=categorical,
        dates=dates,
        feature_order=features,
        mlflow_types={c: mlflow_type(schema.field(c).type) for c in [*features, data.label]},
    )


def check_writable(output: str) -> None:
    """Fail before any work if output cannot be written; creates nothing (probes the nearest existing folder)."""
    fs, inner = filesystem_for(output)
    parent = inner.rstrip("/")
    while True:
        parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
        info = fs.get_file_info(parent or "/")
        if info.type == pafs.FileType.Directory or not parent:
            break
        if info.type == pafs.FileType.File:
            raise DataError(f"inference output {output}: {parent} is a file, not a folder")
    probe = f"{parent}/.trainflow-write-probe-{uuid.uuid4().hex}"
    try:
        with fs.open_output_stream(probe):
            pass
        fs.delete_file(probe)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"inference output {output}: cannot write there ({exc})") from None
