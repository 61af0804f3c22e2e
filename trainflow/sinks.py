"""Predictions written to a table instead of a Parquet folder: a Delta Lake table (one commit), an Apache Iceberg
table of a pyiceberg catalog (one transaction), or a PostgreSQL table (one database transaction). A scoring run's rows
carry the model version that made them and the scoring run's id, and are appended as one commit: a reader sees all of
them or none, a failed or killed run leaves the table as it was, and a retry of the same scoring run finds its rows
committed and writes nothing twice. A missing table is created (by trainflow, marked as its own); an existing one is
appended to only when its columns are the predictions' (checked before anything is scored, exit 2 naming the
columns); nothing is ever dropped, overwritten or deleted."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import pyarrow as pa

from trainflow.errors import DataError

SINK_FORMATS = ("delta", "iceberg", "postgres")
MODEL_COLUMN, RUN_COLUMN, TIME_COLUMN = "model_version", "scoring_run", "scored_at"
RUN_FIELDS = (
    pa.field(MODEL_COLUMN, pa.string()),
    pa.field(RUN_COLUMN, pa.string()),
    pa.field(TIME_COLUMN, pa.timestamp("us", tz="UTC")),
)
CREATED_BY = "trainflow predictions"  # a table trainflow made: its Delta description, Iceberg property, SQL comment


def prediction_columns(id_column: str | None, classes: list | None) -> list[str]:
    """The columns a scoring run appends, in order: [id], prediction, proba_<class>..., model_version, scoring_run,
    scored_at (when the scoring run began writing; one value per run)."""
    return (
        ([id_column] if id_column else [])
        + ["prediction"]
        + [f"proba_{c}" for c in classes or []]
        + [f.name for f in RUN_FIELDS]
    )


@dataclass
class Sink:
    """Where a scoring run's predictions go, and how one commit of them is made."""

    format: str
    table: str  # the Delta table's location, the Iceberg identifier, the PostgreSQL table name
    catalog: dict[str, Any] | None = None
    connection: str | None = None
    password_secret: str | None = None

    @classmethod
    def of(cls, config) -> Sink:
        inf = config.inference
        return cls(
            inf.output_format,
            inf.output,
            inf.catalog if inf.catalog is not None else config.data.catalog,
            inf.connection or config.data.connection,
            inf.password_secret or config.data.password_secret,
        )

    def describe(self) -> str:
        names = {"delta": "Delta table", "iceberg": "Iceberg table", "postgres": "PostgreSQL table"}
        return f"{names[self.format]} {self.table}"

    # -- what is there ------------------------------------------------------------------------------------------

    def columns(self) -> list[str] | None:
        """The existing table's columns; None when there is no table yet."""
        import importlib.util

        module, extra = {"delta": ("deltalake", "lakehouse"), "iceberg": ("pyiceberg", "lakehouse")}.get(
            self.format, ("adbc_driver_postgresql", "postgres")
        )
        if importlib.util.find_spec(module) is None:
            raise DataError(
                f"inference.output_format {self.format} needs the {module} package: pip install 'trainflow[{extra}]'"
            )
        return getattr(self, f"_{self.format}_columns")()

    def check_early(self, id_column: str | None) -> None:
        """Before anything is read or trained: an existing table must hold the columns every scoring run writes
        ([id], prediction, model_version, scoring_run, scored_at) and no others but proba_* (the classes are known
        once the model is; check() then compares every column)."""
        found = self.columns()
        if found is None:
            return
        expected = prediction_columns(id_column, None)
        if [c for c in expected if c not in found] or [
            c for c in found if c not in expected and not c.startswith("proba_")
        ]:
            self.check(expected + [c for c in found if c.startswith("proba_")])

    def check(self, expected: list[str]) -> None:
        """Before scoring: an existing table whose columns are not the predictions' is refused naming them."""
        found = self.columns()
        if found is None:
            return
        missing = [c for c in expected if c not in found]
        extra = [c for c in found if c not in expected]
        if missing or extra:
            parts = ([f"lacks column(s) {missing}"] if missing else []) + (
                [f"has column(s) {extra} the predictions do not"] if extra else []
            )
            raise DataError(
                f"inference.output: the {self.describe()} {' and '.join(parts)}; its columns are {found}, the "
                f"predictions' are {expected}. Name another table (trainflow never alters or drops one)"
            )

    # -- one commit ---------------------------------------------------------------------------------------------

    def write(self, batches: Iterable[pa.RecordBatch], schema: pa.Schema, expected_rows: int, run_id: str) -> int:
        """Append every batch as one commit, unless this scoring run's rows are committed already (a retry): the
        rows committed. The rows are counted as they stream; a count other than expected_rows aborts the commit
        (DataError), so the table is left as it was."""
        done = getattr(self, f"_{self.format}_committed")(run_id)
        if done:
            return done
        counted = _Counted(batches, expected_rows, self.describe())
        getattr(self, f"_{self.format}_append")(counted, schema, run_id)
        return counted.rows

    def latest(self) -> tuple[str, pa.Table]:
        """The newest scoring run's rows (the largest scored_at) and the model that made them: what monitor joins
        labels to. DataError when the table holds no trainflow predictions."""
        table = getattr(self, f"_{self.format}_latest")() if self.columns() is not None else None
        if table is None or table.num_rows == 0 or MODEL_COLUMN not in table.column_names:
            raise DataError(f"inference.output: the {self.describe()} holds no trainflow predictions to monitor")
        return str(table.column(MODEL_COLUMN)[0].as_py()), table

    def _newest(self, table: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        return table.filter(pc.equal(table.column(TIME_COLUMN), pc.max(table.column(TIME_COLUMN))))

    def _delta_latest(self) -> pa.Table:
        return self._newest(self._delta().to_pyarrow_table())

    def _iceberg_latest(self) -> pa.Table:
        return self._newest(self._iceberg().scan().to_arrow())

    def _postgres_latest(self) -> pa.Table:
        from trainflow.postgres import _plain_table, quote_table

        source, (conn, cursor) = self._pg()
        try:
            name = quote_table(self.table)
            source.run(
                cursor,
                f'SELECT * FROM {name} WHERE "{TIME_COLUMN}" = (SELECT max("{TIME_COLUMN}") FROM {name})',
                "output",
            )
            return _plain_table(cursor.fetch_arrow_table())
        finally:
            conn.close()

    # -- Delta Lake ---------------------------------------------------------------------------------------------

    def _delta(self):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.table)
        except TableNotFoundError:
            return None

    def _delta_columns(self) -> list[str] | None:
        table = self._delta()
        return None if table is None else list(table.schema().to_arrow().names)

    def _delta_committed(self, run_id: str) -> int:
        import pyarrow.dataset as pads

        table = self._delta()
        if table is None:
            return 0
        return table.to_pyarrow_dataset().count_rows(filter=pads.field(RUN_COLUMN) == run_id)

    def _delta_append(self, counted: _Counted, schema: pa.Schema, run_id: str) -> None:
        from deltalake import CommitProperties, write_deltalake

        new = self._delta() is None
        reader = pa.RecordBatchReader.from_batches(schema, iter(counted))
        try:
            write_deltalake(
                self.table,
                reader,
                mode="append",
                description=CREATED_BY if new else None,
                commit_properties=CommitProperties(custom_metadata={"trainflow.scoring_run": run_id}),
            )
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - deltalake's SchemaMismatchError, ...; the commit was not made
            if counted.error is not None:
                raise counted.error from None
            raise DataError(f"inference.output: the {self.describe()} refused the predictions: {_first(exc)}") from None

    # -- Apache Iceberg -----------------------------------------------------------------------------------------

    def _iceberg_catalog(self):
        from trainflow.sources import _catalog

        return _catalog(self.catalog)

    def _iceberg(self):
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self._iceberg_catalog().load_table(self.table)
        except NoSuchTableError:
            return None

    def _iceberg_columns(self) -> list[str] | None:
        table = self._iceberg()
        return None if table is None else [f.name for f in table.schema().fields]

    def _iceberg_committed(self, run_id: str) -> int:
        from pyiceberg.expressions import EqualTo

        table = self._iceberg()
        if table is None or table.current_snapshot() is None:
            return 0
        return table.scan(row_filter=EqualTo(RUN_COLUMN, run_id), selected_fields=(RUN_COLUMN,)).to_arrow().num_rows

    def _iceberg_append(self, counted: _Counted, schema: pa.Schema, run_id: str) -> None:
        catalog, table = self._iceberg_catalog(), self._iceberg()
        if table is None:  # the table and its rows in one commit: a failed write leaves no empty table behind
            txn = catalog.create_table_transaction(
                self.table, schema=schema, properties={"trainflow.created_by": CREATED_BY}
            )
        else:
            txn = table.transaction()
        try:
            for batch in _chunks(counted, schema):
                txn.append(batch)
            txn.set_properties({"trainflow.last_scoring_run": run_id})
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyiceberg's ValueError for a schema that does not match, ...
            if counted.error is not None:
                raise counted.error from None
            raise DataError(f"inference.output: the {self.describe()} refused the predictions: {_first(exc)}") from None
        txn.commit_transaction()

    # -- PostgreSQL ---------------------------------------------------------------------------------------------

    def _pg(self):
        from trainflow.postgres import SqlSource

        source = SqlSource(self.connection or "", "SELECT 1", password=_secret(self.password_secret))
        return source, source.connect(read_only=False)

    def _pg_names(self) -> tuple[str, str]:
        schema, _, name = self.table.rpartition(".")
        return schema or "public", name

    def _postgres_columns(self) -> list[str] | None:
        source, (conn, cursor) = self._pg()
        try:
            schema, name = self._pg_names()
            cursor.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 "
                "ORDER BY ordinal_position",
                parameters=(schema, name),
            )
            found = [r[0] for r in cursor.fetchall()]
        finally:
            conn.close()
        return found or None

    def _postgres_committed(self, run_id: str) -> int:
        if self._postgres_columns() is None:
            return 0
        from trainflow.postgres import quote_table

        source, (conn, cursor) = self._pg()
        try:
            cursor.execute(
                f'SELECT count(*) FROM {quote_table(self.table)} WHERE "{RUN_COLUMN}" = $1', parameters=(run_id,)
            )
            return int(cursor.fetchone()[0])
        finally:
            conn.close()

    def _postgres_append(self, counted: _Counted, schema: pa.Schema, run_id: str) -> None:
        from trainflow.postgres import quote_table

        new = self._postgres_columns() is None
        source, (conn, cursor) = self._pg()
        try:
            reader = pa.RecordBatchReader.from_batches(schema, iter(counted))
            try:
                schema_name, name = self._pg_names()
                cursor.adbc_ingest(name, reader, mode="create" if new else "append", db_schema_name=schema_name)
                if new:
                    cursor.execute(f"COMMENT ON TABLE {quote_table(self.table)} IS '{CREATED_BY}'")
            except Exception as exc:  # noqa: BLE001 - the driver's errors; nothing is committed
                conn.rollback()
                if counted.error is not None:
                    raise counted.error from None
                said = source._said(exc)
                raise DataError(f"inference.output: the {self.describe()} refused the predictions: {said}") from None
            conn.commit()  # every row of the scoring run, or (on any error above) none
        finally:
            conn.close()


class _Counted:
    """The batches, counted as they pass; past the last one a count other than expected raises (the writer then
    makes no commit). error: what the batches themselves raised (re-raised as it was, not as the table's refusal)."""

    def __init__(self, batches: Iterable[pa.RecordBatch], expected: int, where: str):
        self.batches, self.expected, self.where = batches, expected, where
        self.rows, self.error = 0, None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        try:
            for batch in self.batches:
                self.rows += batch.num_rows
                yield batch
        except Exception as exc:  # the predictions' own failure (a dead actor, a bad batch): raised as it is
            self.error = exc
            raise
        if self.rows != self.expected:
            self.error = DataError(
                f"inference.output: {self.rows} predictions for {self.expected} input rows; nothing was committed to "
                f"the {self.where}"
            )
            raise self.error


def _chunks(batches: Iterable[pa.RecordBatch], schema: pa.Schema, rows: int = 1_000_000) -> Iterator[pa.Table]:
    """Batches gathered into tables of about rows (an Iceberg append writes a data file per call)."""
    held, count = [], 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(held, schema)
            held, count = [], 0
    if held:
        yield pa.Table.from_batches(held, schema)


def with_run_columns(batches: Iterable[pa.RecordBatch], model: str, run_id: str) -> Iterator[pa.RecordBatch]:
    import datetime

    at = datetime.datetime.now(datetime.timezone.utc)
    for batch in batches:
        n = batch.num_rows
        extra = [pa.array([model] * n, pa.string()), pa.array([run_id] * n, pa.string())]
        extra.append(pa.array([at] * n, RUN_FIELDS[2].type))
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, *extra], names=[*batch.schema.names, *(f.name for f in RUN_FIELDS)]
        )


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _secret(name: str | None) -> str | None:
    from trainflow.postgres import _password

    return _password(name)


def scoring_run_id() -> str:
    """This scoring run's id: the Prefect flow run's (a task retry keeps it), else a new one."""
    import uuid

    from prefect.runtime import flow_run

    return str(flow_run.id or f"predict-{uuid.uuid4().hex[:12]}")


def write_sink(preds, sink: Sink, expected_rows: int, model: str, run_id: str) -> int:
    """preds (a pyarrow Table made in this process, or a Ray Dataset) appended to sink as one commit, each row with
    the model and the scoring run's id."""
    if isinstance(preds, pa.Table):
        batches = iter(preds.to_batches())
        schema = preds.schema
    else:  # the first batch says the schema (asking the lazy dataset would predict its first block twice)
        batches = (b for t in preds.iter_batches(batch_format="pyarrow", batch_size=None) for b in t.to_batches())
        first = next(batches, None)
        if first is None:
            raise DataError(f"inference.output: no predictions to write to the {sink.describe()}")
        schema = first.schema
        batches = itertools.chain([first], batches)
    schema = pa.schema([*schema, *RUN_FIELDS])
    return sink.write(with_run_columns(batches, model, run_id), schema, expected_rows, run_id)
