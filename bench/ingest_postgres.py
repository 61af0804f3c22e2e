"""ingest-postgres: trainflow's read of a PostgreSQL table into training-ready Arrow batches, against a bare COPY ...
TO STDOUT into pyarrow in one process, same run.

The table: INGEST_ROWS rows (2,000,000 by default) of the demo's churn columns in a PostgreSQL 15 server this bench
starts on 127.0.0.1 (tests/servers.Postgres: the machine's initdb/pg_ctl). trainflow: what a retrain does before it
trains: pin_source's copy (one read-only transaction, ADBC's Arrow batches, streamed into Parquet files in the run's
storage) then ingest's read of the copy (tasks/ingest._read_files: in this process or through Ray Data, as
data.materialize decides), then every batch of it. Baseline: ADBC's `SELECT *` in one process, which the driver runs
as `COPY (...) TO STDOUT (FORMAT binary)` and decodes into one Arrow table (the fastest bare COPY into pyarrow; a CSV
COPY parsed by pyarrow.csv is slower). Each side: the best of three. Ratio: trainflow's rows/s over the baseline's
(target >= 0.5: the copy that makes a rerun read the same rows costs at most as much as the read).

Also printed, for the choice of reader: `ray.data.read_sql` of the same table (through the same DB-API driver,
sharded by customer_id), which turns each shard into Python tuples before Arrow."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bench.common import best_of, report

ROWS = int(os.environ.get("INGEST_ROWS", "2000000"))
REPEATS = 3


def _trainflow_rows(config, work: Path) -> int:
    """pin_source's copy under a new run name, then ingest's read of it, every batch."""
    import uuid

    from trainflow.tasks.ingest import _read_files, pin_source

    pinned = pin_source.fn(config, f"bench-{uuid.uuid4().hex[:6]}")
    ds, *_ = _read_files(pinned, None)
    if isinstance(ds, pa.Table):
        return sum(b.num_rows for b in ds.to_batches())
    return sum(b.num_rows for b in ds.iter_batches(batch_format="pyarrow", batch_size=None))


def main() -> None:
    import adbc_driver_postgresql.dbapi as pg

    from tests.conftest import free_port
    from tests.servers import Postgres
    from trainflow.config import config_from_dict
    from trainflow.run.runtime import ensure_ray
    from trainflow.tables.sample import make_churn_table

    server = Postgres(free_port())
    try:
        server.load("churn", make_churn_table(ROWS, seed=7))
        server.execute("VACUUM ANALYZE churn")
        os.environ["PGPASSWORD"] = Postgres.PASSWORD
        uri = f"postgresql://{Postgres.USER}:{Postgres.PASSWORD}@127.0.0.1:{server.port}/postgres"
        with tempfile.TemporaryDirectory(prefix="trainflow-ingest-pg-") as tmp:
            work = Path(tmp)
            config = config_from_dict(
                {
                    "data": {
                        "table": "churn",
                        "connection": server.connection,
                        "label": "churned",
                        "id_column": "customer_id",
                    },
                    "task": "classification",
                    "storage_path": str(work / "runs"),
                }
            )
            ensure_ray(**config.ray_start)
            time.sleep(5)  # Ray's worker processes start after ray.init: not timed against either side

            def bare() -> int:
                with pg.connect(uri) as conn, conn.cursor() as cursor:
                    cursor.execute("SELECT * FROM churn")
                    return cursor.fetch_arrow_table().num_rows

            ours, rows = best_of(lambda: _trainflow_rows(config, work))
            base, plain = best_of(bare)
            assert rows == plain == ROWS, (rows, plain)
            report(
                "ingest-postgres",
                rows / ours / 1e6,
                rows / base / 1e6,
                "M rows/s",
                base / ours,
                f"{ROWS:,} rows x 9 columns, best of {REPEATS}; trainflow: the run's copy to Parquet + ingest's read "
                "of it; baseline: ADBC's COPY TO STDOUT (binary) into one Arrow table",
            )
            import ray.data

            started = time.perf_counter()
            ds = ray.data.read_sql("SELECT * FROM churn", lambda: pg.connect(uri), shard_keys=["customer_id"])
            counted = sum(b.num_rows for b in ds.iter_batches(batch_format="pyarrow", batch_size=None))
            sql_s = time.perf_counter() - started
            assert counted == ROWS
            report(
                "ingest-postgres-read-sql",
                rows / sql_s / 1e6,
                rows / base / 1e6,
                "M rows/s",
                base / sql_s,
                "ray.data.read_sql (sharded by customer_id, the same driver), once: why trainflow copies with ADBC's "
                "Arrow batches instead",
            )
    finally:
        server.close()


if __name__ == "__main__":
    main()
