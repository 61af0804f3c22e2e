"""Memory: the packed table's size checked before training, and a worker killed for memory named as such.

The packed width is bounded (wide text is embedded rather than one-hot), and a configuration that would
still not fit fails here, in seconds, naming the columns and the way out, instead of never finishing.
"""

from __future__ import annotations

from typing import Any

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.errors import DataError, TrainingError

# Ray's memory monitor and Ray Train's worker-failure messages for a process killed for memory
OOM_MARKERS = ("OutOfMemoryError", "running low on memory", "memory pressure", "Worker exit type: SYSTEM_ERROR (OOM")


def packed_bytes_per_row(prep: TabularPreprocessor) -> int:
    """float32 features plus an 8-byte label."""
    return prep.num_features * 4 + 8


def widest_columns(prep: TabularPreprocessor, top: int = 3) -> list[tuple[str, int]]:
    widths = [(c, len(prep.categorical[c]["categories"])) for c in prep.categorical]
    return sorted(widths, key=lambda cw: -cw[1])[:top]


def check_packed_size(
    prep: TabularPreprocessor, rows: int, batch_rows: int, num_workers: int, memory_bytes: float, source: str
) -> dict[str, Any]:
    """Fail fast when one worker's working set of packed rows would not fit its share of memory.

    A worker holds about four mini-batches at once (its batch, the prefetched block's slice, the
    gradient pass and the validation batch, at 4x the batch size); with the whole shard cached when
    the data is materialized. Returns the estimate (logged and put in the summary).
    """
    per_row = packed_bytes_per_row(prep)
    per_worker = memory_bytes / max(1, num_workers)
    estimate = {"bytes_per_row": per_row, "table_bytes": per_row * rows, "features": prep.num_features}
    working_set = per_row * batch_rows * 8
    if working_set > 0.5 * per_worker:
        wide = ", ".join(f"{c!r} ({n} one-hot features)" for c, n in widest_columns(prep)) or "none"
        raise DataError(
            f"{source}: a packed row is {per_row:,} bytes ({prep.num_features:,} features) and a worker's mini-batches "
            f"alone would need {working_set / 2**30:.1f} GiB of the {per_worker / 2**30:.1f} GiB each of "
            f"{num_workers} worker(s) has; the widest text columns are {wide}. Lower preprocess.max_onehot so they "
            "are embedded instead, leave them out of data.features, or lower model.params.mlp.batch_size"
        )
    return estimate


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an exception (or anything in its chain) says a Ray worker or task was killed for memory."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = f"{type(exc).__name__}: {exc}"
        if any(m in text for m in OOM_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def out_of_memory_error(stage: str, num_workers: int | str) -> TrainingError:
    return TrainingError(
        f"a Ray worker was killed for running out of memory during {stage}; retrying would fail the same way. "
        f"Use fewer workers (scaling.num_workers is {num_workers}), a smaller model.params.mlp.batch_size, give Ray "
        "more memory (a larger machine or object store), or narrow the table (data.features, preprocess.max_onehot)"
    )


def check_booster_matrix(
    prep: TabularPreprocessor,
    train_rows: int,
    val_rows: int,
    num_workers: int,
    memory_bytes: float,
    source: str,
    external_memory: str | None = None,
) -> dict[str, Any]:
    """Whether a booster worker's matrices fit its share of memory; fail fast when they would not and the family
    cannot do without them.

    In memory, each worker holds its share of the training rows and the whole validation split as float32
    arrays, and the library copies them once more into its own matrix (XGBoost's DMatrix, LightGBM's Dataset),
    so about twice the packed bytes of those rows. external_memory (XGBoost's model.params.external_memory;
    None for a family without it): "always" or "auto" over the limit -> the estimate says
    external_memory True (the worker builds an ExtMemQuantileDMatrix from its shard, a batch at a time).
    """
    per_row = packed_bytes_per_row(prep)
    per_worker = memory_bytes / max(1, num_workers)
    rows = train_rows / max(1, num_workers) + val_rows
    need = 2 * per_row * rows
    estimate = {
        "bytes_per_row": per_row,
        "table_bytes": per_row * (train_rows + val_rows),
        "features": prep.num_features,
        "worker_matrix_bytes": int(need),
        "external_memory": external_memory == "always",
    }
    over = need > 0.5 * per_worker
    if over and external_memory == "auto":
        estimate["external_memory"] = True
    if over and not estimate["external_memory"]:
        from trainflow.catalogue import families  # the families by name (not the trainer package: it plans with this)

        extmem = " or ".join(f.name for f in families().values() if f.external_memory)
        streams = " or ".join(f.name for f in families().values() if f.uses_minibatches and not f.imports_user_code)
        way_out = (
            f"model.params.external_memory: auto (now never), which reads the shard into {extmem}'s "
            "external-memory matrix"
            if external_memory == "never"
            else f"model.type {extmem}, whose external-memory matrix reads the shard a batch at a time"
        )
        raise DataError(
            f"{source}: a boosted-trees worker holds its {int(train_rows / max(1, num_workers)):,} training rows and "
            f"the {val_rows:,} validation rows as matrices, about {need / 2**30:.1f} GiB of the "
            f"{per_worker / 2**30:.1f} GiB each of {num_workers} worker(s) has. Use {way_out}; more workers across "
            "more machines (scaling.num_workers), a smaller split.validation_fraction, fewer columns (data.features), "
            f"or model.type {streams}, which streams its mini-batches"
        )
    return estimate
