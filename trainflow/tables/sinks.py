"""Predictions written to a table instead of a Parquet folder: a Delta Lake table (one commit), an Apache Iceberg
table of a pyiceberg catalog (one transaction), or a PostgreSQL table (one database transaction). A scoring run's rows
carry the model version that made them and the scoring run's id, and are appended as one commit: a reader sees all of
them or none, a failed or killed run leaves the table as it was, and a retry of the same scoring run finds its rows
committed and writes nothing twice. A missing table is created (by trainflow, marked as its own); an existing one is
appended to only when its columns are the predictions' (checked before anything is scored, exit 2 naming the
columns); nothing is ever dropped, overwritten or deleted."""

from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any, ClassVar, Iterable, Iterator, NamedTuple

import pyarrow as pa

from trainflow.errors import DataError

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


class Sink:
    """Where a scoring run's predictions go, and how one commit of them is made: a class per table format
    (DeltaSink, IcebergSink, PostgresSink), chosen by inference.output_format (Sink.of)."""

    format: ClassVar[str]
    noun: ClassVar[str]
    package: ClassVar[tuple[str, str]]  # the module the format needs, and the extra that installs it

    def __init__(
        self,
        table: str,
        catalog: dict[str, Any] | None = None,
        connection: str | None = None,
        password_secret: str | None = None,
    ):
        self.table = table  # the Delta table's location, the Iceberg identifier, the PostgreSQL table name
        self.catalog, self.connection, self.password_secret = catalog, connection, password_secret

    @classmethod
    def of(cls, config) -> Sink:
        inf = config.inference  # its defaults (the source's server, catalog) resolved when the config loaded
        return SINKS[inf.output_format](inf.output, inf.catalog, inf.connection, inf.password_secret)

    def describe(self) -> str:
        return f"{self.noun} {self.table}"

    # -- what is there ------------------------------------------------------------------------------------------

    def columns(self) -> list[str] | None:
        """The existing table's columns; None when there is no table yet."""
        import importlib.util

        module, extra = self.package
        if importlib.util.find_spec(module) is None:
            raise DataError(
                f"inference.output_format {self.format} needs the {module} package: pip install 'trainflow[{extra}]'"
            )
        with self._session():
            return self._columns()

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
            self._compare(found, expected + [c for c in found if c.startswith("proba_")])

    def check(self, expected: list[str]) -> None:
        """Before scoring: an existing table whose columns are not the predictions' is refused naming them."""
        found = self.columns()
        if found is not None:
            self._compare(found, expected)

    def _compare(self, found: list[str], expected: list[str]) -> None:
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

    def write(
        self, batches: Iterable[pa.RecordBatch], schema: pa.Schema, expected_rows: int, run_id: str, model: str
    ) -> int:
        """Append every batch as one commit, unless this scoring run's rows of this model are committed already (a
        retry): the rows committed. Rows of the same scoring run by another model are a DataError (two configs
        under one run name), not a retry. The rows are counted as they stream; a count other than expected_rows
        aborts the commit (DataError), so the table is left as it was."""
        with self._session():
            done = self._committed(run_id)
            if set(done) - {model}:
                raise DataError(
                    f"inference.output: the {self.describe()} already holds scoring run {run_id!r}'s predictions of "
                    f"{sorted(set(done) - {model})}, not of {model}: a scoring run is one model's; give this one "
                    "another --run-name"
                )
            if done:
                return done[model]
            counted = _Counted(batches, expected_rows, self.describe())
            try:
                self._append(counted, schema, run_id)
            except DataError:
                raise
            except Exception as exc:  # noqa: BLE001 - the format's own refusal (a schema mismatch, ...): no commit
                if counted.error is not None:  # the predictions' own failure, raised as it was
                    raise counted.error from None
                raise DataError(
                    f"inference.output: the {self.describe()} refused the predictions: {self._said(exc)}"
                ) from None
            return counted.rows

    def latest(self) -> tuple[str, pa.Table]:
        """The newest scoring run's rows (the largest scored_at) and the model that made them: what monitor joins
        labels to. DataError when the table holds no trainflow predictions."""
        with self._session():
            table = self._newest() if self.columns() is not None else None
        if table is None or table.num_rows == 0 or MODEL_COLUMN not in table.column_names:
            raise DataError(f"inference.output: the {self.describe()} holds no trainflow predictions to monitor")
        return str(table.column(MODEL_COLUMN)[0].as_py()), table

    # -- what each format says how to do ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        """What the calls inside share (PostgresSink: one connection and transaction)."""
        yield

    def _said(self, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()
        return text[0] if text else type(exc).__name__

    def _columns(self) -> list[str] | None:
        raise NotImplementedError

    def _committed(self, run_id: str) -> dict[str, int]:
        """The rows of scoring run run_id the table holds, by the model that made them (none without a table)."""
        raise NotImplementedError

    def _append(self, counted: _Counted, schema: pa.Schema, run_id: str) -> None:
        """counted's batches appended as one commit, or none of them (an exception)."""
        raise NotImplementedError

    def _newest(self) -> pa.Table:
        """The rows of the largest scored_at."""
        raise NotImplementedError


def _by_model(rows: pa.Table) -> dict[str, int]:
    """A scoring run's rows counted by their model_version."""
    counts = rows.column(MODEL_COLUMN).value_counts()
    return {str(c["values"]): int(c["counts"]) for c in counts.to_pylist()}


def _newest_rows(table: pa.Table) -> pa.Table:
    import pyarrow.compute as pc

    return table.filter(pc.equal(table.column(TIME_COLUMN), pc.max(table.column(TIME_COLUMN))))


class DeltaSink(Sink):
    """A Delta Lake table by its location: one commit per scoring run (its log entry names the run)."""

    format, noun, package = "delta", "Delta table", ("deltalake", "lakehouse")

    def _table(self):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.table)
        except TableNotFoundError:
            return None

    def _columns(self) -> list[str] | None:
        table = self._table()
        return None if table is None else list(table.schema().to_arrow().names)

    def _committed(self, run_id: str) -> dict[str, int]:
        import pyarrow.dataset as pads

        table = self._table()
        if table is None:
            return {}
        found = table.to_pyarrow_dataset().to_table(columns=[MODEL_COLUMN], filter=pads.field(RUN_COLUMN) == run_id)
        return _by_model(found)

    def _append(self, counted: _Counted, schema: pa.Schema, run_id: str) -> None:
        from deltalake import CommitProperties, write_deltalake

        new = self._table() is None
        write_deltalake(
            self.table,
            pa.RecordBatchReader.from_batches(schema, iter(counted)),
            mode="append",
            description=CREATED_BY if new else None,
            commit_properties=CommitProperties(custom_metadata={"trainflow.scoring_run": run_id}),
        )

    def _newest(self) -> pa.Table:
        return _newest_rows(self._table().to_pyarrow_table())


class IcebergSink(Sink):
    """An Apache Iceberg table of a pyiceberg catalog: one transaction per scoring run."""

    format, noun, package = "iceberg", "Iceberg table", ("pyiceberg", "lakehouse")

    def _catalog(self):
        from trainflow.tables.sources.iceberg import _catalog

        return _catalog(self.catalog)

    def _table(self):
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self._catalog().load_table(self.table)
        except NoSuchTableError:
            return None

    def _columns(self) -> list[str] | None:
        table = self._table()
        return None if table is None else [f.name for f in table.schema().fields]

    def _committed(self, run_id: str) -> dict[str, int]:
        from pyiceberg.expressions import EqualTo

        table = self._table()
        if table is None or table.current_snapshot() is None:
            return {}
        return _by_model(table.scan(row_filter=EqualTo(RUN_COLUMN, run_id), selected_fields=(MODEL_COLUMN,)).to_arrow())

    def _append(self, counted: _Counted, schema: pa.Schema, run_id: str) -> None:
        table = self._table()
        if table is None:  # the table and its rows in one commit: a failed write leaves no empty table behind
            txn = self._catalog().create_table_transaction(
                self.table, schema=schema, properties={"trainflow.created_by": CREATED_BY}
            )
        else:
            txn = table.transaction()
        for batch in _chunks(counted, schema):
            txn.append(batch)
        txn.set_properties({"trainflow.last_scoring_run": run_id})
        txn.commit_transaction()

    def _newest(self) -> pa.Table:
        return _newest_rows(self._table().scan().to_arrow())


class _PgSession(NamedTuple):
    source: Any  # the SqlSource that connected (its messages mask the password)
    conn: Any
    cursor: Any
    schema: str  # the table's schema, resolved once: the existing table's, else current_schema()
    name: str
    comment: str | None  # an existing table's comment (CREATED_BY when trainflow made it)
    exists: bool

    @property
    def qualified(self) -> str:
        from trainflow.tables.postgres import quote_table

        return quote_table(f"{self.schema}.{self.name}")


# PostgreSQL's identifiers hold at most 63 bytes (NAMEDATALEN - 1): a longer column name is cut, silently
PG_NAME_MAX = 63


class PostgresSink(Sink):
    """A PostgreSQL table: the columns' check, the retry's count and the append in one connection and one database
    transaction per call (a scoring run makes two: the check before scoring, the write). The table is resolved once
    per call, as the server resolves its name (search_path for a bare name): the check, the create, the comment,
    the count and the read all use that one schema-qualified table. A table trainflow did not create (its comment
    is not trainflow's) is refused, never altered."""

    format, noun, package = "postgres", "PostgreSQL table", ("adbc_driver_postgresql", "postgres")
    _open: _PgSession | None = None

    @functools.cached_property
    def _password(self) -> str | None:
        from trainflow.tables.postgres import _password

        return _password(self.password_secret)  # a Prefect Secret block is read once per sink

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        if self._open is not None:
            yield
            return
        from trainflow.tables.postgres import SqlSource

        source = SqlSource(self.connection or "", "SELECT 1", password=self._password)
        conn, cursor = source.connect(read_only=False)
        try:
            self._open = _PgSession(source, conn, cursor, *self._resolve(source, cursor))
            self._own()
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # a server gone away has rolled it back itself
                conn.rollback()  # nothing of the session is committed
            raise
        else:
            conn.commit()  # every row of the scoring run, or (on any error above) none
        finally:
            self._open = None
            conn.close()

    def _resolve(self, source, cursor) -> tuple[str, str, str | None, bool]:
        """(schema, name, comment, exists) of the table the server means by self.table."""
        from trainflow.tables.postgres import quote_table

        schema, _, name = self.table.rpartition(".")
        try:
            cursor.execute(
                "SELECT n.nspname, c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
                parameters=(quote_table(self.table),),
            )
            found = cursor.fetchone()
            if found is not None:
                return found[0], found[1], found[2], True
            if not schema:
                cursor.execute("SELECT current_schema()")
                schema = cursor.fetchone()[0]
        except Exception as exc:  # noqa: BLE001 - the driver's errors
            said = source._said(exc)
            raise DataError(f"inference.output: PostgreSQL on {source.server} refused {self.table}: {said}") from None
        if not schema:
            raise DataError(
                f"inference.output: {self.table!r} names no schema and the connection's search_path holds none that "
                "exists: name the table as schema.name"
            )
        return schema, name, None, False

    def _own(self) -> None:
        """An existing table must be one trainflow created: another's is refused and never altered."""
        s = self._open
        if s.exists and s.comment != CREATED_BY:
            said = f"its comment: {s.comment!r}" if s.comment else "it has no comment"
            where = "" if self.table == f"{s.schema}.{s.name}" else f"{self.table} is "
            raise DataError(
                f"inference.output: {where}the PostgreSQL table {s.schema}.{s.name}, which trainflow did not create "
                f"({said}; trainflow marks its own {CREATED_BY!r}): it is never written or altered; name another "
                "table (a new one is created)"
            )

    def describe(self) -> str:
        s = self._open
        return f"{self.noun} {s.schema}.{s.name}" if s is not None else super().describe()

    def _said(self, exc: BaseException) -> str:
        return self._open.source._said(exc) if self._open is not None else super()._said(exc)

    def check(self, expected: list[str]) -> None:
        long = [c for c in expected if len(c.encode()) > PG_NAME_MAX]
        if long:
            raise DataError(
                f"inference.output: the column name(s) {long} are longer than PostgreSQL's {PG_NAME_MAX} bytes (it "
                "would cut them): shorten those class names in the label, or write predictions to Parquet or Delta"
            )
        super().check(expected)

    def _columns(self) -> list[str] | None:
        s = self._open
        if not s.exists:
            return None
        s.cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 "
            "ORDER BY ordinal_position",
            parameters=(s.schema, s.name),
        )
        return [r[0] for r in s.cursor.fetchall()] or None

    def _committed(self, run_id: str) -> dict[str, int]:
        s = self._open
        if not s.exists:
            return {}
        s.cursor.execute(
            f'SELECT "{MODEL_COLUMN}", count(*) FROM {s.qualified} WHERE "{RUN_COLUMN}" = $1 GROUP BY 1',
            parameters=(run_id,),
        )
        return {str(model): int(n) for model, n in s.cursor.fetchall()}

    def _append(self, counted: _Counted, schema: pa.Schema, run_id: str) -> None:
        s = self._open
        reader = pa.RecordBatchReader.from_batches(schema, iter(counted))
        s.cursor.adbc_ingest(s.name, reader, mode="append" if s.exists else "create", db_schema_name=s.schema)
        if not s.exists:
            s.cursor.execute(f"COMMENT ON TABLE {s.qualified} IS '{CREATED_BY}'")

    def _newest(self) -> pa.Table:
        from trainflow.tables.postgres import _plain_table

        s = self._open
        s.source.run(
            s.cursor,
            f'SELECT * FROM {s.qualified} WHERE "{TIME_COLUMN}" = (SELECT max("{TIME_COLUMN}") FROM {s.qualified})',
            "output",
        )
        return _plain_table(s.cursor.fetch_arrow_table())


SINKS: dict[str, type[Sink]] = {s.format: s for s in (DeltaSink, IcebergSink, PostgresSink)}
SINK_FORMATS = tuple(SINKS)


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
    return sink.write(with_run_columns(batches, model, run_id), schema, expected_rows, run_id, model)
