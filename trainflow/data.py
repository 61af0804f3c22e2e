"""Reading, checking, fingerprinting, splitting and preprocessing tables with Ray Data and pyarrow.fs."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
import ray.data
from ray.data.aggregate import AggregateFnV2, Count, Max, Mean, Min, Std, ValueCounter

from trainflow.preprocessors.baseline import (
    STEP, categorical_baseline, count_batch, label_baseline, merge_counts, numeric_baseline,
)
from trainflow.preprocessors.dates import date_parts, is_temporal_type, looks_like_dates, parts_for
from trainflow.preprocessors.tabular import TabularPreprocessor, is_numeric_type, is_string_type
from trainflow.config import DataSection, PreprocessSection
from trainflow import pacing
from trainflow.errors import DataError
from trainflow.storage import filesystem_for, is_uri, with_scheme
from trainflow.tables import check_names, csv_arguments, check_csv_header, list_files

def streamed_task_args() -> dict:
    """Ray Data task arguments for a pipeline read while Ray Train's workers run (a streamed table).

    The workers hold the CPUs (1 each by default); a read or map task asking for a CPU then never gets
    scheduled and every worker waits for its first block forever: the stall measured with 2 workers on
    2 CPUs. The tasks ask for none, at most one per CPU at a time.
    """
    return {"num_cpus": 0, "concurrency": max(1, int(ray.cluster_resources().get("CPU", 1)))}


def read_table(
    path: str, fmt: str, streamed: bool = False, listed: tuple[pafs.FileSystem, list[str]] | None = None,
    csv: Any = None,
) -> tuple[ray.data.Dataset, list[str], pafs.FileSystem]:
    """A lazy Ray Dataset over the table at path, with its files and filesystem.

    streamed: read beside running training workers (streamed_task_args), the files in a random order
    per read (Ray's file shuffle: the streaming half of a large table's shuffle). listed: list_files'
    answer for path when the caller has it already. csv: the config's data.csv section."""
    fs, files = listed or list_files(path, fmt)
    extra = {}
    if streamed:
        args = streamed_task_args()
        extra = {"ray_remote_args": {"num_cpus": args["num_cpus"]}, "concurrency": args["concurrency"],
                 "shuffle": "files"}
    if fmt == "csv":
        check_csv_header(fs, files[0], csv, path)
    try:
        if fmt == "csv":
            ds = ray.data.read_csv(files, filesystem=fs, **csv_arguments(csv), **extra)
        else:
            ds = ray.data.read_parquet(files, filesystem=fs, **extra)
    except Exception as exc:  # noqa: BLE001 - Ray wraps pyarrow's errors in many types
        raise DataError(f"cannot read {path} as {fmt}: {str(exc).splitlines()[0]}") from None
    if streamed:
        # blocks small against the store (Ray's default is up to 128 MiB): a 3M-row file read as 33 MiB blocks
        # into a 100 MiB store left the next operator a budget of 1 byte, and the workers waited forever
        store = ray.cluster_resources().get("object_store_memory", 0)
        ds.context.target_max_block_size = int(min(128 * 2**20, max(2**20, store / 32)))
    return ds, [with_scheme(path, f) for f in files], fs


def in_memory_bytes(fs: pafs.FileSystem, files: list[str], fmt: str) -> int:
    """The table's size once decoded, from file metadata only: Parquet row groups' uncompressed sizes,
    CSV files' sizes (text takes at least as much room as the values it encodes)."""
    total = 0
    for f in files:
        inner = f.split("://", 1)[1] if is_uri(f) else f
        if fmt == "parquet":
            meta = pq.ParquetFile(fs.open_input_file(inner)).metadata
            total += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        else:
            total += fs.get_file_info(inner).size or 0
    return total


def should_materialize(mode: str, table_bytes: int, fraction: float = 0.25) -> tuple[bool, str]:
    """(materialize?, why) for data.materialize and the table's in-memory size against Ray's object store.

    The materialized path holds the table, then its split parts and their packed copies: about four
    times the table, hence a quarter of the store.
    """
    store = ray.cluster_resources().get("object_store_memory", 0)
    sizes = f"{table_bytes / 2**20:,.0f} MiB in memory, object store {store / 2**20:,.0f} MiB"
    if mode == "always":
        return True, f"data.materialize: always ({sizes})"
    if mode == "never":
        return False, f"data.materialize: never ({sizes})"
    if table_bytes < fraction * store:
        return True, f"{sizes}: under a quarter of the store"
    return False, f"{sizes}: over a quarter of the store, streamed from the files each epoch"


def arrow_schema(ds: ray.data.Dataset, source: str) -> pa.Schema:
    """The dataset's pyarrow schema; DataError when the table has no columns at all."""
    schema = ds.schema(fetch_if_missing=True)
    if schema is None or not schema.names:
        raise DataError(f"{source}: the table is empty (no columns)")
    check_names(list(schema.names), source)
    return schema.base_schema if hasattr(schema, "base_schema") else schema


def fingerprint(fs: pafs.FileSystem, files: list[str], schema: pa.Schema, content: bool = True, fmt: str = "parquet") -> str:
    """A hash of the input files and their schema, prefixed by what it covers.

    content=True ("content:"): every byte of every file, so the same bytes give the same fingerprint.
    content=False ("metadata:"), for a table streamed because it is larger than the object store: each file's
    name, size and modification time, and a Parquet file's footer (row groups, sizes, column statistics), so a
    table of many GiB, or one on a remote filesystem, is not read once more in full just to name it.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(str(schema).encode())
    for f in files:
        inner = f.split("://", 1)[1] if is_uri(f) else f  # the path inside fs, as list_files found it
        h.update(inner.rsplit("/", 1)[-1].encode())
        if not content:
            info = fs.get_file_info(inner)
            h.update(f"{info.size}:{info.mtime_ns}".encode())
            if fmt == "parquet":
                with fs.open_input_file(inner) as source:
                    h.update(repr(pq.ParquetFile(source).metadata.to_dict()).encode())
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
    mlflow_types: dict[str, str] = field(default_factory=dict)  # column -> MLflow ColSpec type


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


def check_columns(
    schema: pa.Schema, data: DataSection, task: str, source: str
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Check label/feature/id columns exist with usable types; return (features, numeric, categorical, dates)."""
    names = list(schema.names)
    for role, col in (("label", data.label), ("id", data.id_column)):
        if col is not None and col not in names:
            raise DataError(f"{source}: {role} column {col!r} not found; columns are {names}")
    features = data.features or [c for c in names if c not in (data.label, data.id_column)]
    missing = [c for c in features if c not in names]
    if missing:
        raise DataError(f"{source}: feature column(s) {missing} not found; columns are {names}")
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
            raise DataError(f"{source}: column {col!r} holds text that is not UTF-8; set data.csv.encoding to the "
                            "file's encoding (e.g. latin-1, cp1252)")
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


def table_spec(schema: pa.Schema, data: DataSection, task: str, source: str, files: list[str] | None = None) -> TableSpec:
    """Check the table's columns (check_columns) and describe them: kinds, order and MLflow signature types.

    rows and fingerprint stay 0/"" until ingest has read the data.
    """
    features, numeric, categorical, dates = check_columns(schema, data, task, source)
    return TableSpec(
        path=source, files=files or [], label=data.label, id_column=data.id_column, numeric=numeric,
        categorical=categorical, dates=dates, feature_order=features,
        mlflow_types={c: mlflow_type(schema.field(c).type) for c in features},
    )


def check_text_columns(ds: ray.data.Dataset, spec: TableSpec, parse_dates: bool, source: str, sample: int = 2000) -> None:
    """Look at a sample of each text column: ISO-8601 dates move to spec.dates (when parse_dates), and a
    column of nearly all numbers with stray text is an error naming the value."""
    text_columns = list(spec.categorical)
    if not text_columns:
        return
    rows = ds.select_columns(text_columns).take(sample)
    for col in text_columns:
        values = [r[col] for r in rows if r[col] is not None and str(r[col]).strip() != ""]
        if parse_dates and looks_like_dates(values):
            spec.categorical.remove(col)
            spec.dates.append(col)
            continue
        bad = []
        for v in values:
            try:
                float(v)
            except ValueError:
                bad.append(v)
        if values and len(bad) <= 0.05 * len(values) and bad:
            raise DataError(
                f"{source}: column {col!r} holds numbers but also the text {bad[0]!r}; "
                "fix or blank those values"
            )


def _bad_labels(batch: pa.Table, label: str) -> dict[str, np.ndarray]:
    col = batch[label]
    bad = col.null_count
    if pa.types.is_floating(col.type):
        vals = col.to_numpy(zero_copy_only=False)
        bad = int((~np.isfinite(vals)).sum())
    return {"bad": np.array([bad], dtype=np.int64), "rows": np.array([batch.num_rows], dtype=np.int64)}


def _nulls(batch: pa.Table, column: str) -> dict[str, np.ndarray]:
    return {"nulls": np.array([batch[column].null_count], dtype=np.int64)}


def count_nulls(ds: ray.data.Dataset, column: str) -> int:
    """Rows whose column is null (one pass over that column)."""
    out = ds.select_columns([column]).map_batches(_nulls, fn_kwargs={"column": column}, batch_format="pyarrow")
    return int(out.sum("nulls") or 0)


def count_rows_and_bad_labels(ds: ray.data.Dataset, label: str) -> tuple[int, int]:
    """(rows, labels that are null, NaN or infinite) in one vectorised pass."""
    out = ds.select_columns([label]).map_batches(_bad_labels, fn_kwargs={"label": label}, batch_format="pyarrow")
    agg = out.sum(["rows", "bad"]) or {}
    return int(agg.get("sum(rows)") or 0), int(agg.get("sum(bad)") or 0)


def split_fraction_keys(batch: pa.Table, columns: list[str], seed: int) -> np.ndarray:
    """A number in [0, 1) per row from a seeded hash of its values in columns: the same row gets the same
    number in every run, on every worker and in either data path (materialized or streamed)."""
    import pandas as pd

    hashed = pd.util.hash_pandas_object(batch.select(columns).to_pandas(), index=False).to_numpy(dtype=np.uint64)
    # pandas' hash_key only salts text columns: mix the seed in with splitmix64's finalizer instead
    salt = np.uint64(int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=8).digest(), "little"))
    z = hashed + salt
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _in_validation(batch: pa.Table, columns: list[str], seed: int, fraction: float, label: str | None,
                   eligible: list | None) -> np.ndarray:
    below = split_fraction_keys(batch, columns, seed) < fraction
    if eligible is not None:  # a class too small to give a validation row keeps all its rows for training
        below &= pc.is_in(batch[label], value_set=pa.array(eligible, type=batch.schema.field(label).type)).to_numpy(
            zero_copy_only=False)
    return below


def _split_counts(batch: pa.Table, columns: list[str], seed: int, fraction: float, label: str | None) -> pa.Table:
    below = split_fraction_keys(batch, columns, seed) < fraction
    if label is None:
        return pa.table({"below": [int(below.sum())], "rows": [batch.num_rows]})
    labels = batch[label].to_numpy(zero_copy_only=False)
    values, inverse = np.unique(labels, return_inverse=True)
    return pa.table({"value": pa.array(values.tolist(), type=batch.schema.field(label).type).cast(pa.string()),
                     "below": np.bincount(inverse, weights=below, minlength=len(values)).astype(np.int64),
                     "rows": np.bincount(inverse, minlength=len(values)).astype(np.int64)})


def _part(batch: pa.Table, val: bool, **kwargs) -> pa.Table:
    in_val = _in_validation(batch, **kwargs)
    return batch.filter(pa.array(in_val if val else ~in_val))


def split_table(ds: ray.data.Dataset, task: str, label: str, fraction: float, seed: int, key_columns: list[str],
                materialize: bool):
    """Seeded, reproducible train/validation split: (train, val, train_rows, val_rows).

    A row goes to validation when a seeded hash of its key columns (the id column, else every column)
    falls below `fraction`, so no materialized copy or driver-side key list is needed and the same rows
    land on the same side whether the table is materialized or streamed from its files. One counting pass
    gives the rows per class (stratification: every class with enough rows gets about `fraction` of them in
    validation; a class with fewer than 1/fraction rows keeps them all for training) and the part sizes.
    materialize: shuffle the training part once and keep both parts in the object store; otherwise both
    stay lazy (re-read from the files each time they are iterated).
    """
    by_label = label if task == "classification" else None
    counts = ds.select_columns(list(dict.fromkeys([*key_columns, label]))).map_batches(
        _split_counts, fn_kwargs={"columns": key_columns, "seed": seed, "fraction": fraction, "label": by_label},
        batch_format="pyarrow", batch_size=None,
    ).take_all()
    eligible = None
    if by_label is None:
        rows, val_rows = sum(r["rows"] for r in counts), sum(r["below"] for r in counts)
    else:
        per_class: dict[str, list[int]] = {}
        for r in counts:
            tot = per_class.setdefault(r["value"], [0, 0])
            tot[0] += r["rows"]
            tot[1] += r["below"]
        rows = sum(t[0] for t in per_class.values())
        eligible_text = [v for v, (n, _) in per_class.items() if n * fraction >= 1]
        val_rows = sum(per_class[v][1] for v in eligible_text)
        label_type = arrow_schema(ds, "split").field(label).type
        eligible = pa.array(eligible_text, type=pa.string()).cast(label_type).to_pylist()
    kwargs = {"columns": key_columns, "seed": seed, "fraction": fraction, "label": by_label, "eligible": eligible}
    task_args = {} if materialize else streamed_task_args()
    train = ds.map_batches(_part, fn_kwargs={**kwargs, "val": False}, batch_format="pyarrow", **task_args)
    val = ds.map_batches(_part, fn_kwargs={**kwargs, "val": True}, batch_format="pyarrow", **task_args)
    if materialize:
        # SGD needs mixed batches; a table that fits is shuffled once. Streamed tables are mixed per epoch
        # by the files' order and a fresh permutation of each block's rows on the workers instead.
        train, val = train.random_shuffle(seed=seed).materialize(), val.materialize()
    return train, val, rows - val_rows, val_rows


class FineHistogram(AggregateFnV2):
    """Counts of floor(asinh(x) / STEP) over a numeric column (nulls and NaN left out): mergeable, range-free."""

    def __init__(self, on: str, alias_name: str):
        super().__init__(alias_name, on=on, ignore_nulls=True, zero_factory=dict)

    def aggregate_block(self, block: pa.Table) -> dict[int, int]:
        x = block[self._target_col_name].to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        keys = np.floor(np.arcsinh(x[np.isfinite(x)]) / STEP).astype(np.int64)
        if not keys.size:
            return {}
        low = int(keys.min())
        counts = np.bincount(keys - low)  # a few thousand bins at most (asinh of a float64 is within +-711)
        found = np.flatnonzero(counts)
        return dict(zip((found + low).tolist(), counts[found].tolist()))

    def combine(self, current_accumulator: dict, new_accumulator: dict) -> dict:
        out = dict(current_accumulator)
        for k, v in new_accumulator.items():
            out[k] = out.get(k, 0) + v
        return out


def _has_aggregate_kernels(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _cast_columns(batch: pa.Table, casts: dict[str, pa.DataType]) -> pa.Table:
    # Ray's Std has no kernel for bool or decimal columns; those are aggregated as float64
    for name, typ in casts.items():
        i = batch.schema.get_field_index(name)
        batch = batch.set_column(i, name, batch[name].cast(typ))
    return batch


DATE_PART_SEP = "\x1f"  # joins a date column and a part name in the fit's expanded table


def _expand_dates(batch: pa.Table, dates: dict[str, list[str]]) -> pa.Table:
    # each date column becomes its numeric parts, so Ray's Mean/Std/Count aggregate them like numbers
    for col, parts in dates.items():
        values = date_parts(batch[col], parts)
        batch = batch.drop_columns([col])
        for part, arr in values.items():
            batch = batch.append_column(f"{col}{DATE_PART_SEP}{part}", pa.array(arr, mask=np.isnan(arr)))
    return batch


def _partial_aggregates(batch: pa.Table, aggs: list) -> dict[str, np.ndarray]:
    out = np.empty(1, dtype=object)
    out[0] = [agg.accumulate_block(agg.init(None), batch) for agg in aggs]
    return {"partial": out}


def aggregate_streaming(ds: ray.data.Dataset, aggs: list) -> dict[str, Any]:
    """Ray Data aggregates (Count, Mean, Std, ValueCounter ...) over ds as a streaming map-reduce: each block's
    partial accumulators in a map task, merged here as they arrive, then finalized; the aggregate functions'
    own accumulate/merge/finalize do the arithmetic.

    `Dataset.aggregate` is an all-to-all operator that holds every input block before it starts: on the
    12M-row beyond-memory table (a 200 MiB object store) it spilled 678 MiB, the whole spill of the run; this
    keeps one block at a time per map task.
    """
    merged = [agg.init(None) for agg in aggs]
    partials = ds.map_batches(_partial_aggregates, fn_kwargs={"aggs": aggs}, batch_format="pyarrow", batch_size=None)
    for batch in partials.iter_batches(batch_size=None, batch_format="numpy"):
        for accs in batch["partial"]:
            merged = [agg.merge(m, a) for agg, m, a in zip(aggs, merged, accs)]
    return {agg.name: agg.finalize(m) for agg, m in zip(aggs, merged)}


class BoundedValueCounter(ValueCounter):
    """Ray's ValueCounter holding at most `keep` values (the most frequent, and always the null count): a text
    column with millions of distinct values (ids, UUIDs) costs the driver `keep` entries, not one per value.

    Each block's counts are cut to `keep` before they leave its task and every merge cuts again, so a value
    near the cut may be undercounted; values frequent enough to be kept by max_categories are far above it.
    """

    def __init__(self, on: str, alias_name: str | None = None, keep: int = 200_000):
        super().__init__(on, alias_name)
        self.keep = keep

    def _cut(self, acc: dict[str, list]) -> dict[str, list]:
        acc = {"values": list(acc["values"]), "counts": list(acc["counts"])}  # writable (blocks arrive read-only)
        if len(acc["values"]) <= self.keep:
            return acc
        order = sorted(range(len(acc["values"])), key=lambda i: (acc["values"][i] is not None, -acc["counts"][i]))
        kept = order[: self.keep]
        return {"values": [acc["values"][i] for i in kept], "counts": [acc["counts"][i] for i in kept]}

    def aggregate_block(self, block):
        return self._cut(super().aggregate_block(block))

    def combine(self, current_accumulator, new_accumulator):
        writable = {"values": list(current_accumulator["values"]), "counts": list(current_accumulator["counts"])}
        return self._cut(super().combine(writable, new_accumulator))


def fit_preprocessor(
    train: ray.data.Dataset, spec: TableSpec, task: str, options: PreprocessSection | None = None
) -> TabularPreprocessor:
    """Fit imputation, missing indicators, scaling, date parts and text vocabularies on the training split
    with Ray Data aggregates (one pass)."""
    options = options or PreprocessSection()
    schema = arrow_schema(train, spec.path)
    dates = {c: parts_for(schema.field(c).type) for c in spec.dates}
    date_cols = {c: [f"{c}{DATE_PART_SEP}{p}" for p in parts] for c, parts in dates.items()}
    aggs = [Count()]
    for col in spec.numeric + [p for parts in date_cols.values() for p in parts]:
        aggs += [Mean(col, ignore_nulls=True, alias_name=f"mean:{col}"), Std(col, ddof=0, ignore_nulls=True, alias_name=f"std:{col}"),
                 Count(col, ignore_nulls=True, alias_name=f"present:{col}")]
    for col in spec.numeric:
        aggs += [Min(col, ignore_nulls=True, alias_name=f"min:{col}"), Max(col, ignore_nulls=True, alias_name=f"max:{col}"),
                 FineHistogram(col, alias_name=f"hist:{col}")]
    keep = 2 * options.max_categories + 1000  # the kept vocabulary, with room for values near its cut
    for col in spec.categorical:
        aggs.append(BoundedValueCounter(col, alias_name=f"counts:{col}", keep=keep))
    if task == "classification":
        aggs.append(ValueCounter(spec.label, alias_name="counts:__label__"))
    else:
        aggs += [Mean(spec.label, alias_name="mean:__label__"), Std(spec.label, ddof=0, alias_name="std:__label__"),
                 FineHistogram(spec.label, alias_name="hist:__label__")]
    cols = spec.feature_order + [spec.label]
    # only the columns Ray's aggregates cannot take as they are: casting every column to float64 doubled the
    # fit's time on 2M x 16 float32 (1.0-1.1 s vs 0.5-0.6 s, measured here) for no change in the result
    numeric = spec.numeric + ([spec.label] if task == "regression" else [])
    casts = {c: pa.float64() for c in numeric if not _has_aggregate_kernels(schema.field(c).type)}
    if task == "classification" and pa.types.is_decimal(schema.field(spec.label).type):
        casts[spec.label] = pa.float64()  # decimal classes as numbers: JSON (the checkpoint) has no decimal
    projected = train.select_columns(cols)
    if casts:
        projected = projected.map_batches(_cast_columns, fn_kwargs={"casts": casts}, batch_format="pyarrow")
    if dates:
        projected = projected.map_batches(_expand_dates, fn_kwargs={"dates": dates}, batch_format="pyarrow")
    stats = aggregate_streaming(projected, aggs)
    rows = stats["count()"]

    def counts(key: str, with_null: bool = False) -> dict:
        vc = stats[key] or {"values": [], "counts": []}
        return {v: int(c) for v, c in zip(vc["values"], vc["counts"]) if with_null or v is not None}

    def missing(col: str) -> int:
        return rows - int(stats[f"present:{col}"] or 0)

    classes, label_counts = None, None
    if task == "classification":
        label_counts = counts("counts:__label__")
        classes = list(label_counts)
        if len(classes) < 2:
            raise DataError(
                f"{spec.path}: label column {spec.label!r} has only one class ({classes}) in the training rows; "
                "classification needs at least two"
            )
    category_counts = {c: {None if k is None else str(k): v for k, v in counts(f"counts:{c}", True).items()}
                       for c in spec.categorical}
    baseline = {
        "rows": rows,
        "columns": {**{c: numeric_baseline(stats[f"hist:{c}"], rows, missing(c)) for c in spec.numeric},
                    **{c: categorical_baseline(category_counts[c], rows) for c in spec.categorical}},
        "label": label_baseline(task, label_counts, stats.get("hist:__label__"), rows),
    }
    return TabularPreprocessor.from_stats(
        task=task,
        label=spec.label,
        feature_order=spec.feature_order,
        numeric_stats={c: tuple(stats[f"{k}:{c}"] for k in ("mean", "std", "min", "max")) for c in spec.numeric},
        category_counts=category_counts,
        classes=classes,
        label_stats=None if task == "classification" else (stats["mean:__label__"], stats["std:__label__"]),
        train_rows=rows,
        class_counts=label_counts,
        missing={**{c: missing(c) for c in spec.numeric}, **{c: missing(ps[-1]) for c, ps in date_cols.items()}},
        date_stats={
            c: {p: (stats[f"mean:{name}"], stats[f"std:{name}"]) for p, name in zip(dates[c], date_cols[c])} for c in dates
        },
        max_onehot=options.max_onehot,
        min_frequency=options.min_frequency,
        max_categories=options.max_categories,
        baseline=baseline,
    )


def _unseen_in_batch(batch: pa.Table, prep: dict) -> pa.Table:
    p = TabularPreprocessor.from_dict(prep)
    out = {}
    for col in p.text_columns():
        mask = p.unseen_mask(col, batch)
        out[col] = [int(mask.sum())]
        out[f"{col}\x1fexample"] = [str(batch[col][int(np.flatnonzero(mask)[0])].as_py()) if mask.any() else None]
    return pa.table(out)


def count_unseen(ds: ray.data.Dataset, prep: TabularPreprocessor) -> dict[str, dict]:
    """Per text column, the rows whose value is outside the model's vocabulary, and one such value (one pass)."""
    cols = list(prep.text_columns())
    if not cols:
        return {}
    per_batch = ds.select_columns(cols).map_batches(
        _unseen_in_batch, fn_kwargs={"prep": prep.to_dict()}, batch_format="pyarrow", batch_size=None
    ).take_all()
    out = {}
    for col in cols:
        rows = sum(r[col] for r in per_batch)
        if rows:
            out[col] = {"rows": rows, "example": next(r[f"{col}\x1fexample"] for r in per_batch if r[col])}
    return out


def _drift_counts(batch: pa.Table, baseline: dict) -> pa.Table:
    return pa.table({"counts": [json.dumps(count_batch(baseline, batch))]})


def count_drift(ds: ray.data.Dataset, baseline: dict[str, Any]) -> dict[str, list[int]]:
    """Counts of ds in the baseline's buckets with Ray tasks (a table already in memory: a pass over the object
    store, not the files; streamed tables are counted by the predictors instead)."""
    cols = [c for c in baseline.get("columns", {}) if c in arrow_schema(ds, "scoring table").names]
    if not cols:
        return {}
    parts = ds.select_columns(cols).map_batches(_drift_counts, fn_kwargs={"baseline": baseline}, batch_format="pyarrow",
                                                batch_size=None).take_all()
    return merge_counts([json.loads(p["counts"]) for p in parts])


def check_unseen(unseen: dict[str, dict], prep: TabularPreprocessor, source: str) -> None:
    """inference.on_unseen: error — fail on the first column holding a value the model never saw."""
    for col, found in unseen.items():
        known = prep.text_columns()[col]
        raise DataError(
            f"{source}: column {col!r} has category {found['example']!r} that the model never saw in training "
            f"({found['rows']} row(s) with unseen values; known: {known[:10]}{' ...' if len(known) > 10 else ''}); "
            "set inference.on_unseen: unknown to predict such rows with the model's unknown code"
        )


def _transform(batch: pa.Table, prep: dict, strict: bool) -> dict[str, np.ndarray]:
    return TabularPreprocessor.from_dict(prep).transform_batch(batch, strict=strict)


def apply_preprocessor(ds: ray.data.Dataset, prep: TabularPreprocessor, streamed: bool = False) -> ray.data.Dataset:
    """Lazily transform a split into the packed {'features', 'label'} tensor columns."""
    if streamed:  # no select_columns: its own task asks for a CPU (the transform reads only its columns anyway)
        return ds.map_batches(_transform, fn_kwargs={"prep": prep.to_dict(), "strict": False}, batch_format="pyarrow",
                              batch_size=None, **streamed_task_args())
    cols = prep.feature_order + [prep.label]
    return ds.select_columns(cols).map_batches(
        _transform, fn_kwargs={"prep": prep.to_dict(), "strict": False}, batch_format="pyarrow", batch_size=None
    )


def pack(
    train: ray.data.Dataset, val: ray.data.Dataset, prep: TabularPreprocessor, materialize: bool
) -> tuple[ray.data.Dataset, ray.data.Dataset]:
    """Both splits as packed tensor columns: materialized in the object store, or lazy to be streamed (the
    files are read in a random order and the workers permute each block's rows)."""
    train, val = apply_preprocessor(train, prep, not materialize), apply_preprocessor(val, prep, not materialize)
    if materialize:
        return train.materialize(), val.materialize()
    # no randomize_block_order: it is an all-to-all step that holds every block in the object store
    return pacing.pace(train), pacing.pace(val)


def fit_and_pack(
    train: ray.data.Dataset, val: ray.data.Dataset, spec: TableSpec, task: str, options: PreprocessSection | None = None
) -> tuple[TabularPreprocessor, ray.data.Dataset, ray.data.Dataset]:
    """Fit the preprocessor on train only, then pack and materialize both splits."""
    prep = fit_preprocessor(train, spec, task, options)
    return (prep, *pack(train, val, prep, materialize=True))


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
