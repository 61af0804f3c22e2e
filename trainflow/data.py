"""Ray Data over a table: reading it (materialized or streamed beside training), its schema, counts of rows, bad
labels and nulls, and its rows split into the roles and folds of a plan (trainflow/roles/ makes the plan)."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import ray
import ray.data

from trainflow.errors import DataError
from trainflow.run.runtime import cluster_resources

from trainflow.run.storage import with_scheme
from trainflow.tables.columns import check_names
from trainflow.tables.files import list_files
from trainflow.tables.sources import source


Rows = ray.data.Dataset | pa.Table  # a split's rows: Ray Data's, or a small table's in this process's memory


def column_names(rows: Rows) -> list[str]:
    """The rows' column names."""
    return list(rows.schema.names if isinstance(rows, pa.Table) else rows.schema().names)


def arrow_batches(rows: Rows, columns: list[str], batch_size: int = 65536) -> Iterator[pa.Table]:
    """The rows' columns as pyarrow batches of at most batch_size rows: read here for a table in this process's
    memory, through Ray Data's iterator otherwise."""
    if isinstance(rows, pa.Table):
        table = rows.select(columns)
        for start in range(0, table.num_rows, batch_size):
            yield table.slice(start, batch_size)
        return
    yield from rows.select_columns(columns).iter_batches(batch_size=batch_size, batch_format="pyarrow")


def first_rows(rows: Rows, columns: list[str], n: int) -> pa.Table:
    """The first n rows' columns as one pyarrow table."""
    if isinstance(rows, pa.Table):
        return rows.select(columns).slice(0, n)
    return rows.select_columns(columns).take_batch(n, batch_format="pyarrow")


def streamed_task_args() -> dict:
    """Ray Data task arguments for a pipeline read while Ray Train's workers run (a streamed table).

    The workers hold the CPUs (1 each by default); a read or map task asking for a CPU then never gets
    scheduled and every worker waits for its first block forever. The tasks ask for none, at most one per CPU at a time.
    """
    return {"num_cpus": 0, "concurrency": max(1, int(ray.cluster_resources().get("CPU", 1)))}


def read_table(
    path: str,
    fmt: str,
    streamed: bool = False,
    listed: tuple[pafs.FileSystem, list[str]] | None = None,
    csv: Any = None,
) -> tuple[ray.data.Dataset, list[str], pafs.FileSystem]:
    """A lazy Ray Dataset over the table at path, with its files and filesystem.

    streamed: read beside running training workers (streamed_task_args), the files in a random order
    per read (Ray's file shuffle: the streaming half of a large table's shuffle). listed: list_files'
    answer for path when the caller has it already. csv: the config's data.csv section."""
    fs, files = listed or list_files(path, fmt)
    extra = streamed_read_args() if streamed else {}
    files_of = source(fmt)
    files_of.check_files(fs, files[0], csv, path)
    try:
        ds = files_of.ray_read(files, fs, csv, **extra)
    except Exception as exc:  # noqa: BLE001 - Ray wraps pyarrow's errors in many types
        raise DataError(f"cannot read {path} as {fmt}: {str(exc).splitlines()[0]}") from None
    return (bounded_blocks(ds) if streamed else ds), [with_scheme(path, f) for f in files], fs


def streamed_read_args() -> dict[str, Any]:
    """A read beside running training workers (streamed_task_args), its files in a random order per read (Ray's
    file shuffle: the streaming half of a large table's shuffle)."""
    args = streamed_task_args()
    return {"ray_remote_args": {"num_cpus": args["num_cpus"]}, "concurrency": args["concurrency"], "shuffle": "files"}


def bounded_blocks(ds: ray.data.Dataset) -> ray.data.Dataset:
    """A streamed read's blocks small against the store (Ray's default is up to 128 MiB): a 3M-row file read as
    33 MiB blocks into a 100 MiB store left the next operator a budget of 1 byte, and the workers waited forever."""
    store = ray.cluster_resources().get("object_store_memory", 0)
    ds.context.target_max_block_size = int(min(128 * 2**20, max(2**20, store / 32)))
    return ds


def should_materialize(mode: str, table_bytes: int, fraction: float = 0.25) -> tuple[bool, str]:
    """(materialize?, why) for data.materialize and the table's in-memory size against Ray's object store.

    The materialized path holds the table, then its split parts and their packed copies: about four
    times the table, hence a quarter of the store.
    """
    store = cluster_resources().get("object_store_memory", 0)
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


def has_label(table: pa.Table, label: str) -> np.ndarray:
    """Per row: whether its label is there (not null, and for numbers finite), as _bad_labels counts them: the rows
    a replay's cutoff may train on and score (a row whose label never arrived is left out and counted)."""
    column = table[label]
    ok = pc.is_valid(column)
    if pa.types.is_floating(column.type):
        ok = pc.and_(ok, pc.is_finite(column))
    return ok.to_numpy(zero_copy_only=False).astype(bool)


def _nulls(batch: pa.Table, column: str) -> dict[str, np.ndarray]:
    return {"nulls": np.array([batch[column].null_count], dtype=np.int64)}


def count_nulls(ds: ray.data.Dataset, column: str) -> int:
    """Rows whose column is null (one pass over that column)."""
    out = ds.select_columns([column]).map_batches(_nulls, fn_kwargs={"column": column}, batch_format="pyarrow")
    return int(out.sum("nulls") or 0)


def count_rows_and_bad_labels(ds: Rows, label: str) -> tuple[int, int]:
    """(rows, labels that are null, NaN or infinite) in one vectorised pass (this process's, for a table in its memory)."""
    if isinstance(ds, pa.Table):
        return ds.num_rows, int(_bad_labels(ds, label)["bad"][0])
    out = ds.select_columns([label]).map_batches(_bad_labels, fn_kwargs={"label": label}, batch_format="pyarrow")
    agg = out.sum(["rows", "bad"]) or {}
    return int(agg.get("sum(rows)") or 0), int(agg.get("sum(bad)") or 0)


def per_batch(rows: Rows, fn, kwargs: dict, columns: list[str]) -> list[dict]:
    """fn (a batch of rows' columns -> a small table) over rows, its results' rows as dicts: this process's one call
    for a table in its memory, a Ray task per block of a Dataset."""
    if isinstance(rows, pa.Table):
        return fn(rows.select(columns), **kwargs).to_pylist()
    return (
        rows.select_columns(columns)
        .map_batches(fn, fn_kwargs=kwargs, batch_format="pyarrow", batch_size=None)
        .take_all()
    )


def schema_of(rows: Rows, source: str = "") -> pa.Schema:
    """The Arrow schema of a table in memory or of a Dataset (arrow_schema)."""
    return rows.schema if isinstance(rows, pa.Table) else arrow_schema(rows, source)


def _role(batch: pa.Table, plan, role: int) -> pa.Table:
    return batch.filter(pa.array(plan.roles(batch) == role))


def plan_roles(plan) -> list[int]:
    """The roles the plan gives rows: training, validation on one split, test when it has a test share."""
    from trainflow.roles.folds import TEST, TRAIN, VALIDATION

    return [TRAIN] + ([VALIDATION] if plan.folds < 2 else []) + ([TEST] if plan.test_fraction > 0 else [])


def _filtered(rows: Rows, fn, variants: list[dict], materialize: bool) -> list[Rows]:
    """rows filtered by fn(batch, **kwargs), once per kwargs in variants: here for a table in this process's memory,
    lazily by Ray tasks for a Dataset (streamed tasks ask for no CPU: streamed_task_args)."""
    if isinstance(rows, pa.Table):
        return [fn(rows, **kwargs) for kwargs in variants]
    task_args = {} if materialize else streamed_task_args()
    return [rows.map_batches(fn, fn_kwargs=kwargs, batch_format="pyarrow", **task_args) for kwargs in variants]


def split_roles(rows: Rows, plan, materialize: bool) -> dict[int, Rows]:
    """The table's rows by role (folds.TRAIN, VALIDATION, TEST), with the training rows in a seeded random order
    where they are held (SGD needs mixed batches): a table in this process's memory cut here; a Dataset read lazily
    or, with materialize, kept in the object store (streamed tables are mixed per epoch by the files' order and a
    fresh permutation of each block's rows on the workers instead). With folds, TRAIN holds every non-test row
    (fold_parts cuts it)."""
    from trainflow.roles.folds import TRAIN

    roles = plan_roles(plan)
    parts = dict(zip(roles, _filtered(rows, _role, [{"plan": plan, "role": r} for r in roles], materialize)))
    if isinstance(rows, pa.Table):
        parts[TRAIN] = parts[TRAIN].take(np.random.default_rng(plan.seed).permutation(parts[TRAIN].num_rows))
    elif materialize:
        parts = {r: (p.random_shuffle(seed=plan.seed) if r == TRAIN else p).materialize() for r, p in parts.items()}
    return parts


def _fold(batch: pa.Table, plan, fold: int, held: bool) -> pa.Table:
    ids = plan.fold_ids(batch)
    return batch.filter(pa.array(ids == fold if held else (ids != fold)))


def fold_parts(fit_rows: Rows, plan, fold: int, materialize: bool) -> tuple[Rows, Rows]:
    """(training rows, held-out rows) of fold model `fold`: the non-test rows (split_roles' TRAIN) outside and inside
    that fold."""
    return tuple(
        _filtered(fit_rows, _fold, [{"plan": plan, "fold": fold, "held": h} for h in (False, True)], materialize)
    )


def _earlier_role(batch: pa.Table, plan, role: int) -> pa.Table:
    return batch.filter(pa.array(plan.earlier_roles(batch) == role))


def earlier_parts(fit_rows: Rows, plan, materialize: bool) -> tuple[Rows, Rows]:
    """(training rows, early-stopping rows) of the backtest's earlier model (FoldPlan.earlier), from the rows the
    recent model could read (split_roles' TRAIN)."""
    from trainflow.roles.folds import TRAIN, VALIDATION

    return tuple(
        _filtered(fit_rows, _earlier_role, [{"plan": plan, "role": r} for r in (TRAIN, VALIDATION)], materialize)
    )
