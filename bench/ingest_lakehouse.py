"""ingest-iceberg and ingest-delta: trainflow's read of a lakehouse table at a snapshot into training-ready Arrow
batches, against a plain pyarrow read of the same snapshot's data files in one process, same run.

The table: INGEST_ROWS rows (2,000,000 by default) of the demo's churn columns, written as an Iceberg table of
pyiceberg's SQL catalog (SQLite) and as a Delta table, in a temporary folder. trainflow: tasks/ingest.py's read of a
snapshot (resolve the snapshot, size it from the files' footers, read it through the format's own scan or Ray Data's
reader as data.materialize decides), then every batch of it; its Ray instance is started (and settled) before the
clock. Baseline: `pyarrow.parquet.read_table` of the snapshot's data files. Each side: the best of three reads. Ratio: trainflow's rows/s over the baseline's (target
>= 0.7: the format's bookkeeping costs little)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import best_of, report

ROWS = int(os.environ.get("INGEST_ROWS", "2000000"))
REPEATS = 3


def _table(rows: int) -> pa.Table:
    from trainflow.tables.sample import make_churn_table

    return make_churn_table(rows, seed=7)


def _trainflow_rows(config, snap) -> int:
    from trainflow.tasks.ingest import _read_snapshot

    ds, *_ = _read_snapshot(config, snap)
    if isinstance(ds, pa.Table):
        return sum(b.num_rows for b in ds.to_batches())
    return sum(b.num_rows for b in ds.iter_batches(batch_format="pyarrow", batch_size=None))


def _measure(name: str, config, snap) -> None:
    from trainflow.run.storage import filesystem_for

    fs, _ = filesystem_for(snap.files[0])
    files = [filesystem_for(f)[1] for f in snap.files]
    ours, rows = best_of(lambda: _trainflow_rows(config, snap), REPEATS)
    base, plain = best_of(lambda: pq.read_table(files, filesystem=fs).num_rows)
    assert rows == plain == ROWS, (rows, plain)
    report(
        name,
        rows / ours / 1e6,
        rows / base / 1e6,
        "M rows/s",
        base / ours,
        f"{ROWS:,} rows, {len(snap.files)} data file(s), {snap.describe()}, best of {REPEATS}; baseline: "
        "pyarrow.parquet.read_table of its files",
    )


def main() -> None:
    import deltalake
    from pyiceberg.catalog.sql import SqlCatalog

    from trainflow.config import config_from_dict
    from trainflow.run.runtime import ensure_ray
    from trainflow.tables.sources import resolve_snapshot

    table = _table(ROWS)
    with tempfile.TemporaryDirectory(prefix="trainflow-ingest-") as tmp:
        work = Path(tmp)
        catalog = {"uri": f"sqlite:///{work / 'catalog.db'}", "warehouse": f"file://{work / 'warehouse'}"}
        iceberg = SqlCatalog("default", **catalog)
        iceberg.create_namespace("bench")
        iceberg.create_table("bench.churn", schema=table.schema).append(table)
        deltalake.write_deltalake(str(work / "delta"), table)
        base = {"label": "churned", "id_column": "customer_id"}
        for name, data in (
            ("ingest-iceberg", {"path": "bench.churn", "format": "iceberg", "catalog": catalog}),
            ("ingest-delta", {"path": str(work / "delta"), "format": "delta"}),
        ):
            config = config_from_dict(
                {"data": {**base, **data}, "task": "classification", "storage_path": str(work / "runs")}
            )
            ensure_ray(**config.ray_start)
            time.sleep(5)  # Ray's worker processes start after ray.init: not timed against either side
            _measure(name, config, resolve_snapshot(config.data))


if __name__ == "__main__":
    main()
