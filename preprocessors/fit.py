"""Fitting the preprocessor with Ray Data (a streaming map-reduce over the training split), applying it, counting
unseen values and drift in a pass, and packing rows for training; plus the look at text columns that turns
ISO-8601 text into dates."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray.data.block import BlockAccessor
from ray.data.aggregate import AggregateFnV2, Count, ValueCounter

from trainflow import pacing
from trainflow.errors import DataError
from trainflow.roles.folds import label_unfit_for_task
from trainflow.preprocessors.baseline import (
    STEP,
    categorical_baseline,
    count_batch,
    label_baseline,
    merge_counts,
    numeric_baseline,
)
from trainflow.preprocessors.dates import date_parts, looks_like_dates, parts_for
from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.config import PreprocessSection
from trainflow.data import Rows, per_batch, schema_of, streamed_task_args
from trainflow.tables.files import TableSpec


def check_text_columns(
    ds: ray.data.Dataset | pa.Table, spec: TableSpec, parse_dates: bool, source: str, sample: int = 2000
) -> None:
    """Look at a sample of each text column (of a Ray Dataset, or a table in this process's memory): ISO-8601 dates
    move to spec.dates (when parse_dates), and a column of nearly all numbers with stray text is an error naming
    the value."""
    text_columns = list(spec.categorical)
    if not text_columns:
        return
    rows = (
        ds.select(text_columns).slice(0, sample).to_pylist()
        if isinstance(ds, pa.Table)
        else ds.select_columns(text_columns).take(sample)
    )
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
                f"{source}: column {col!r} holds numbers but also the text {bad[0]!r}; fix or blank those values"
            )


def _fine_histogram(column) -> dict[int, int]:
    """Counts of floor(asinh(x) / STEP) over a numeric column (nulls and NaN left out): mergeable, range-free."""
    x = column.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    keys = np.floor(np.arcsinh(x[np.isfinite(x)]) / STEP).astype(np.int64)
    if not keys.size:
        return {}
    low = int(keys.min())
    counts = np.bincount(keys - low)  # a few thousand bins at most (asinh of a float64 is within +-711)
    found = np.flatnonzero(counts)
    return dict(zip((found + low).tolist(), counts[found].tolist()))


def _add_counts(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


class ColumnStats(AggregateFnV2):
    """One numeric column's count of values, mean, standard deviation (ddof 0), min, max and (histogram=True) its
    fine histogram (_fine_histogram), in one pass per block with pyarrow compute, merged across blocks with the
    parallel variance update that Ray's own Std uses. Nulls are left out; a NaN makes the mean and spread NaN, as in
    Ray's Mean and Std. Finalized: {"count", "mean", "std", "min", "max", "hist"}."""

    def __init__(self, on: str, alias_name: str, histogram: bool = True):
        super().__init__(alias_name, on=on, ignore_nulls=True, zero_factory=lambda: None)
        self.histogram = histogram

    def aggregate_block(self, block: pa.Table) -> list | None:
        col = block[self._target_col_name]
        count = pc.count(col).as_py()
        if not count:
            return None
        mean = pc.mean(col).as_py()
        m2 = pc.variance(col, ddof=0).as_py() * count
        bounds = pc.min_max(col).as_py()
        return [count, mean, m2, bounds["min"], bounds["max"], _fine_histogram(col) if self.histogram else {}]

    def combine(self, current_accumulator: list, new_accumulator: list) -> list:
        n_a, mean_a, m2_a, low_a, high_a, hist_a = current_accumulator
        n_b, mean_b, m2_b, low_b, high_b, hist_b = new_accumulator
        n = n_a + n_b
        delta = mean_b - mean_a
        return [
            n,
            (mean_a * n_a + mean_b * n_b) / n,
            m2_a + m2_b + delta * delta * n_a * n_b / n,
            min(low_a, low_b),
            max(high_a, high_b),
            _add_counts(hist_a, hist_b),
        ]

    def finalize(self, accumulator: list) -> dict[str, Any]:
        count, mean, m2, low, high, hist = accumulator
        return {
            "count": count,
            "mean": mean,
            "std": math.sqrt(m2 / count) if count else None,
            "min": low,
            "max": high,
            "hist": hist,
        }


def _column_stats(stats: dict[str, Any], col: str) -> dict[str, Any]:
    """ColumnStats' answer for col; an all-null (or empty) column's: no values."""
    return stats[f"stats:{col}"] or {"count": 0, "mean": None, "std": None, "min": None, "max": None, "hist": {}}


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


def _prepared(batch: pa.Table, casts: dict[str, pa.DataType], dates: dict[str, list[str]]) -> pa.Table:
    return _expand_dates(_cast_columns(batch, casts), dates)


def _partial_aggregates(batch: pa.Table, aggs: list, casts: dict, dates: dict) -> dict[str, np.ndarray]:
    out = np.empty(1, dtype=object)
    out[0] = [agg.accumulate_block(agg.init(None), _prepared(batch, casts, dates)) for agg in aggs]
    return {"partial": out}


def aggregate(
    rows: Rows, aggs: list, casts: dict[str, pa.DataType] | None = None, dates: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """Ray Data aggregates (Count, Mean, Std, ValueCounter ...) over rows, each batch first cast (casts) and its date
    columns expanded into parts (dates): a table in this process's memory as one block, here; a Dataset as a
    streaming map-reduce: each block's partial accumulators in a map task, merged here as they arrive, then
    finalized; the aggregate functions' own accumulate/merge/finalize do the arithmetic.

    `Dataset.aggregate` is an all-to-all operator that holds every input block before it starts: on the
    12M-row beyond-memory table (a 200 MiB object store) it spilled 678 MiB, the whole spill of the run; this
    keeps one block at a time per map task.
    """
    kwargs = {"aggs": aggs, "casts": casts or {}, "dates": dates or {}}
    if isinstance(rows, pa.Table):
        block = _prepared(rows, kwargs["casts"], kwargs["dates"])  # one block, here
        return {agg.name: agg.finalize(agg.accumulate_block(agg.init(None), block)) for agg in aggs}
    merged = [agg.init(None) for agg in aggs]
    partials = rows.map_batches(_partial_aggregates, fn_kwargs=kwargs, batch_format="pyarrow", batch_size=None)
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


def _counts(stats: dict, key: str, with_null: bool = False) -> dict:
    """A value counter's result as {value: count} (None, the nulls' count, only with_null)."""
    vc = stats[key] or {"values": [], "counts": []}
    return {v: int(c) for v, c in zip(vc["values"], vc["counts"]) if with_null or v is not None}


def _label_counts(stats: dict, spec: TableSpec, task: str, rows: int) -> dict | None:
    """Classification: each class's training rows (at least two classes); regression: None, once the label is seen
    to take more than one or two values."""
    if task == "classification":
        label_counts = _counts(stats, "counts:__label__")
        if len(label_counts) < 2:
            raise label_unfit_for_task(spec.path, spec.label, task, "the training rows", str(list(label_counts)))
        return label_counts
    if len(stats.get("hist:__label__") or {}) <= 2:
        # every value within a fine bin of one or two values (asinh steps): a class written as numbers, or no label
        low, high = (
            float(np.sinh(STEP * k)) for k in (min(stats["hist:__label__"] or [0]), max(stats["hist:__label__"] or [0]))
        )
        raise label_unfit_for_task(
            spec.path, spec.label, task, f"its {rows:,} training rows", f"about {low:.4g} and {high:.4g}"
        )
    return None


def fit_preprocessor(
    train: Rows, spec: TableSpec, task: str, options: PreprocessSection | None = None
) -> TabularPreprocessor:
    """Fit imputation, missing indicators, scaling, date parts and text vocabularies on the training split
    with Ray Data's aggregate functions (one pass; in this process for a table in its memory)."""
    options = options or PreprocessSection()
    schema = schema_of(train, spec.path)
    dates = {c: parts_for(schema.field(c).type) for c in spec.dates}
    date_cols = {c: [f"{c}{DATE_PART_SEP}{p}" for p in parts] for c, parts in dates.items()}
    aggs = [Count()]
    parts = [p for names in date_cols.values() for p in names]
    # one fused aggregate per number column (count, mean, spread, range, histogram for drift): one pass each
    aggs += [ColumnStats(col, f"stats:{col}", histogram=col not in parts) for col in spec.numeric + parts]
    keep = 2 * options.max_categories + 1000  # the kept vocabulary, with room for values near its cut
    for col in spec.categorical:
        aggs.append(BoundedValueCounter(col, alias_name=f"counts:{col}", keep=keep))
    if task == "classification":
        aggs.append(ValueCounter(spec.label, alias_name="counts:__label__"))
    else:
        aggs.append(ColumnStats(spec.label, "stats:__label__"))
    cols = spec.feature_order + [spec.label]
    # only the columns Ray's aggregates cannot take as they are: casting every column to float64 doubles the
    # fit's time for no change in the result
    numeric = spec.numeric + ([spec.label] if task == "regression" else [])
    casts = {c: pa.float64() for c in numeric if not _has_aggregate_kernels(schema.field(c).type)}
    if task == "classification" and pa.types.is_decimal(schema.field(spec.label).type):
        casts[spec.label] = pa.float64()  # decimal classes as numbers: JSON (the checkpoint) has no decimal
    stats = aggregate(
        train.select(cols) if isinstance(train, pa.Table) else train.select_columns(cols), aggs, casts, dates
    )
    rows = stats["count()"]
    for col in [*spec.numeric, *parts, *([] if task == "classification" else ["__label__"])]:
        found = _column_stats(stats, col)
        stats.update({f"{k}:{col}": found[k] for k in ("mean", "std", "min", "max", "hist")})
        stats[f"present:{col}"] = found["count"]

    def missing(col: str) -> int:
        return rows - int(stats[f"present:{col}"] or 0)

    label_counts = _label_counts(stats, spec, task, rows)
    classes = list(label_counts) if label_counts is not None else None
    category_counts = {
        c: {None if k is None else str(k): v for k, v in _counts(stats, f"counts:{c}", True).items()}
        for c in spec.categorical
    }
    baseline = {
        "rows": rows,
        "columns": {
            **{c: numeric_baseline(stats[f"hist:{c}"], rows, missing(c)) for c in spec.numeric},
            **{c: categorical_baseline(category_counts[c], rows) for c in spec.categorical},
        },
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
            c: {p: (stats[f"mean:{name}"], stats[f"std:{name}"]) for p, name in zip(dates[c], date_cols[c])}
            for c in dates
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


def count_unseen(rows: Rows, prep: TabularPreprocessor) -> dict[str, dict]:
    """Per text column, the rows whose value is outside the model's vocabulary, and one such value (one pass; a
    table in this process's memory is counted here)."""
    cols = list(prep.text_columns())
    return _sum_unseen(per_batch(rows, _unseen_in_batch, {"prep": prep.to_dict()}, cols), cols) if cols else {}


def _sum_unseen(per_batch: list[dict], cols: list[str]) -> dict[str, dict]:
    out = {}
    for col in cols:
        rows = sum(r[col] for r in per_batch)
        if rows:
            out[col] = {"rows": rows, "example": next(r[f"{col}\x1fexample"] for r in per_batch if r[col])}
    return out


def _drift_counts(batch: pa.Table, baseline: dict) -> pa.Table:
    return pa.table({"counts": [json.dumps(count_batch(baseline, batch))]})


def count_drift(rows: Rows, baseline: dict[str, Any]) -> dict[str, list[int]]:
    """Counts of rows in the baseline's buckets: here for a table in this process's memory, else with Ray tasks (a
    table already in the object store: a pass over it, not the files; streamed tables are counted by the predictors
    instead)."""
    cols = [c for c in baseline.get("columns", {}) if c in schema_of(rows, "scoring table").names]
    if not cols:
        return {}
    parts = per_batch(rows, _drift_counts, {"baseline": baseline}, cols)
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
        return ds.map_batches(
            _transform,
            fn_kwargs={"prep": prep.to_dict(), "strict": False},
            batch_format="pyarrow",
            batch_size=None,
            **streamed_task_args(),
        )
    cols = prep.feature_order + [prep.label]
    return ds.select_columns(cols).map_batches(
        _transform, fn_kwargs={"prep": prep.to_dict(), "strict": False}, batch_format="pyarrow", batch_size=None
    )


def _packed(rows: pa.Table, prep: TabularPreprocessor) -> pa.Table:
    # transformed here into one block of tensor columns (what map_batches would make), held in this process: a fit in
    # Ray Train's local mode reads it where it is, a worker group's through the object store (trainer/shards.py)
    return BlockAccessor.batch_to_block(prep.transform_batch(rows, strict=False))


def pack(train: Rows, val: Rows, prep: TabularPreprocessor, materialize: bool) -> tuple[Rows, Rows]:
    """Both splits as packed tensor columns: materialized in the object store, or lazy to be streamed (the
    files are read in a random order and the workers permute each block's rows). A table in this process's memory
    is transformed here and stays here (no Ray: trainer/shards.py in_process_rows hands it to the fit)."""
    if isinstance(train, pa.Table):
        return _packed(train, prep), _packed(val, prep)
    train, val = apply_preprocessor(train, prep, not materialize), apply_preprocessor(val, prep, not materialize)
    if materialize:
        return train.materialize(), val.materialize()
    # no randomize_block_order: it is an all-to-all step that holds every block in the object store
    return pacing.pace(train), pacing.pace(val)


def fit_and_pack(
    train: ray.data.Dataset, val: ray.data.Dataset, spec: TableSpec, task: str, options: Any | None = None
) -> tuple[TabularPreprocessor, ray.data.Dataset, ray.data.Dataset]:
    """Fit the preprocessor on train only, then pack and materialize both splits."""
    prep = fit_preprocessor(train, spec, task, options)
    return (prep, *pack(train, val, prep, materialize=True))
