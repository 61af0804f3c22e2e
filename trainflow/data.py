"""Ray Data over a table: reading it (materialized or streamed beside training), its schema, counts of rows, bad
labels and nulls, and the seeded train/validation split."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import ray
import ray.data

from trainflow.errors import DataError
from trainflow.storage import with_scheme
from trainflow.tables import check_csv_header, check_names, csv_arguments, list_files


def streamed_task_args() -> dict:
    """Ray Data task arguments for a pipeline read while Ray Train's workers run (a streamed table).

    The workers hold the CPUs (1 each by default); a read or map task asking for a CPU then never gets
    scheduled and every worker waits for its first block forever. The tasks ask for none, at most one per CPU at a time.
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
