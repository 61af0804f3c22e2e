"""A PostgreSQL table or query as a training table: read in one read-only transaction (one snapshot of the database
for every row) through ADBC's PostgreSQL driver, which streams the result as Arrow record batches over COPY ... TO
STDOUT (binary), and written once, as Parquet, to the run's storage. That copy is what the run trains on and what a
rerun or resume of its run name reads, however the table changed since: the record beside it names the server, the
query, the row count and the copy's files.

The password never appears in the config: libpq's own PGPASSWORD (or ~/.pgpass), or a Prefect Secret block named by
data.password_secret. It is added to the connection only in this process's memory and masked in every message.

Why not ray.data.read_sql: it turns each shard into Python tuples (fetchall) before Arrow, holds a whole shard in
memory, and shards a query by re-running it once per shard with a hash filter (each shard a separate transaction:
no one snapshot); bench/ingest_postgres.py measures both against a bare COPY."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pyarrow as pa

from trainflow.errors import DataError, InfrastructureError
from trainflow.run.services import is_down

COPY_ROWS_PER_FILE = 1_000_000  # the copy's Parquet files: Ray Data reads them in parallel, a file per task
COPY_ROW_GROUP_ROWS = 128 * 1024
COPY_FILE = "part-{:05d}.parquet"  # the copy's files, in order; COPY_FILE_PATTERN is how a check knows one
COPY_FILE_PATTERN = r"part-\d{5}\.parquet"
# what libpq says when the server goes away under a query (is_down knows a refused connection)
_GONE = (
    "server closed the connection",
    "terminating connection",
    "could not receive data",
    "no connection to the server",
)
# libpq's settings every connection gets unless its URI sets them: keepalives (a silent peer noticed in about 60 s),
# tcp_user_timeout (unacknowledged data given up after 60 s), and a connect timeout
LIBPQ_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
    "connect_timeout": "30",
}
_CREDENTIAL_WORDS = ("password", "secret", "token")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$")


def server_of(connection: str) -> str:
    """host:port/database of a connection URI (what the record and messages name; never a password)."""
    parts = urlsplit(connection)
    host = parts.hostname or "localhost"
    return f"{host}:{parts.port or 5432}{parts.path or '/'}"


def check_connection(connection: str) -> None:
    """ValueError for a connection URI that is not PostgreSQL's or that carries a password."""
    parts = urlsplit(connection)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(
            f"connection: {server_of(connection)!r} is not a PostgreSQL URI (postgresql://user@host:port/database)"
        )
    secret = [k for k, _ in parse_qsl(parts.query) if any(w in k.lower() for w in _CREDENTIAL_WORDS)]
    if parts.password is not None or secret:
        where = f"its {secret[0]}= parameter" if secret and parts.password is None else "a password"
        raise ValueError(
            f"connection: the URI carries {where}; a config file never does: leave it out and set PGPASSWORD in "
            "the environment, or name a Prefect Secret block in data.password_secret"
        )


def check_table_name(table: str) -> None:
    if not _IDENTIFIER.match(table):
        raise ValueError(
            f"table: {table!r} is not a table name (`name` or `schema.name`; for anything else write data.sql)"
        )


def quote_table(table: str) -> str:
    return ".".join(quote_name(part) for part in table.split("."))


def quote_name(name: str) -> str:
    """An identifier (a column's name) quoted for PostgreSQL: any character, a double quote doubled."""
    return '"' + name.replace('"', '""') + '"'


def around(query: str) -> str:
    """The query as a subquery, on lines of its own: a trailing `-- comment` cannot swallow what follows."""
    return f"(\n{query}\n) AS q"


@dataclass(frozen=True)
class SqlSource:
    """What a PostgreSQL source reads: the server, and a query (data.sql, or every row of data.table)."""

    connection: str  # without a password
    query: str
    table: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, data) -> SqlSource:
        query = data.sql.strip().rstrip(";") if data.sql else f"SELECT * FROM {quote_table(data.table)}"
        return cls(data.connection, query, data.table, _password(data.password_secret))

    @property
    def server(self) -> str:
        return server_of(self.connection)

    @property
    def what(self) -> str:
        return f"table {self.table}" if self.table else "query"

    def describe(self) -> str:
        return f"PostgreSQL {self.what} on {self.server}"

    def _uri(self) -> str:
        """The URI libpq connects with: TCP keepalives and a user timeout (a host gone without a reset is noticed in
        about a minute, not TCP's hours) and a connect timeout, unless the connection sets its own; the password
        (when not libpq's own PGPASSWORD or ~/.pgpass) in memory only."""
        parts = urlsplit(self.connection)
        query = dict(parse_qsl(parts.query))
        query = {**LIBPQ_DEFAULTS, **query}
        netloc = parts.netloc
        if self.password is not None:
            user = quote(parts.username or "", safe="")
            netloc = f"{user}:{quote(self.password, safe='')}@{parts.hostname}" + (
                f":{parts.port}" if parts.port else ""
            )
        return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), parts.fragment))

    def _masked(self, text: str) -> str:
        if self.password:
            text = text.replace(self.password, "***").replace(quote(self.password, safe=""), "***")
        return text

    def connect(self, read_only: bool = True):
        """An ADBC connection in one transaction: read-only and REPEATABLE READ (one snapshot for all it reads), or
        (read_only False) the server's default, for a sink's one commit. A server that refuses connections is
        waited for (services.database_wait_s, saying so), then ServiceUnavailable naming it; a refused login is a
        DataError at once."""
        try:
            import adbc_driver_postgresql.dbapi as pg
        except ModuleNotFoundError:
            raise DataError("a PostgreSQL source needs its driver: pip install 'trainflow[postgres]'") from None
        from trainflow.run.services import WAITS, patient

        try:
            conn = patient(
                lambda: pg.connect(self._uri()), "PostgreSQL", self.server, "database_wait_s", WAITS.database
            )
        except pg.Error as exc:
            said = self._masked(" ".join(str(exc).split()))
            hint = (
                " (the password: PGPASSWORD, ~/.pgpass, or the Prefect Secret block data.password_secret names)"
                if "password" in said or "authentication" in said
                else ""
            )
            raise DataError(f"data.connection: cannot connect to PostgreSQL at {self.server}: {said}{hint}") from None
        cursor = conn.cursor()
        if read_only:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return conn, cursor

    @property
    def key(self) -> str:
        return "table" if self.table else "sql"

    def _said(self, exc: BaseException) -> str:
        said = self._masked(str(exc)).split("\n\nQuery was:")[0]
        return " ".join(said.replace("Failed to prepare query:", "").split())

    def run(self, cursor, sql: str, what: str) -> None:
        try:
            cursor.execute(sql)
        except Exception as exc:  # noqa: BLE001 - the driver's ProgrammingError, OperationalError, ...
            raise self._failure(exc, what) from None

    def _failure(self, exc: BaseException, what: str) -> Exception:
        """A refused query (DataError: the config's to fix), or a server gone in the middle (InfrastructureError:
        the same command again, once it is back)."""
        said = self._said(exc)
        if is_down(exc) or any(s in said for s in _GONE):
            return InfrastructureError(
                f"PostgreSQL at {self.server} went away while reading data.{what}: {said}; nothing was recorded: run "
                "the same command again when it is back"
            )
        return DataError(f"data.{what}: PostgreSQL on {self.server} refused it: {said}")

    def batches(self, cursor) -> Iterator[pa.RecordBatch]:
        """The query's rows, a record batch at a time (the driver's types; its per-column metadata dropped)."""
        self.run(cursor, self.query, self.key)
        try:
            reader = cursor.fetch_record_batch()
            schema = _plain(reader.schema)
            for batch in reader:
                yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
        except (DataError, InfrastructureError):
            raise
        except Exception as exc:  # noqa: BLE001 - the driver's errors while the rows stream
            raise self._failure(exc, self.key) from None

    def guarded(self, conn, batches: Iterator) -> _Guarded:
        """batches (read on conn) each waited for at most services.database_read_s; close() closes conn."""
        from trainflow.run.services import WAITS

        return _Guarded(batches, WAITS.database_read, conn, lambda: self.stalled(WAITS.database_read))

    def read_one(self, work):
        """work(cursor) on a new read-only connection, waited for at most services.database_read_s."""
        conn, cursor = self.connect()
        read = self.guarded(conn, (work(cursor) for _ in range(1)))
        try:
            return next(iter(read))
        finally:
            read.close()

    def stalled(self, seconds: float) -> InfrastructureError:
        return InfrastructureError(
            f"PostgreSQL at {self.server} sent nothing for {seconds:g} s while reading data.{self.key} "
            "(services.database_read_s): the server or its backend is stuck (a frozen process, a lost host, a lock "
            "the query waits on); the read was cancelled and nothing was recorded: run the same command again when "
            "it answers, or raise services.database_read_s for a query that takes longer before its first row"
        )

    def schema(self) -> pa.Schema:
        """The query's columns and types, from the server's plan of it (no row read)."""

        def plan(cursor) -> pa.Schema:
            try:
                return _plain(cursor.adbc_execute_schema(self.query))
            except Exception as exc:  # noqa: BLE001 - the driver's ProgrammingError, ...
                raise DataError(f"data.{self.key}: PostgreSQL on {self.server} refused it: {self._said(exc)}") from None

        return self.read_one(plan)

    def watermark(self, column: str | None) -> str:
        """What the watch compares between looks: max(column), or the row count; with the server and the query."""
        expr = f"max({quote_name(column)})::text" if column else "count(*)::text"

        def look(cursor) -> str | None:
            self.run(cursor, f"SELECT {expr} FROM {around(self.query)}", "watermark" if column else self.key)
            return cursor.fetchone()[0]

        value = self.read_one(look)
        ident = json.dumps([self.server, self.query, column, value])
        return "watermark:" + hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()


class SqlScan:
    """A PostgreSQL source as the pyarrow dataset calls the checks before Ray starts make of a table: its schema,
    and the columns they read (one query of those columns)."""

    def __init__(self, source: SqlSource):
        self.source = source
        self.schema = source.schema()

    def to_table(self, columns: list[str] | None = None) -> pa.Table:
        cols = ", ".join(quote_name(c) for c in columns) if columns else "*"

        def rows(cursor) -> pa.Table:
            self.source.run(cursor, f"SELECT {cols} FROM {around(self.source.query)}", self.source.key)
            return _plain_table(cursor.fetch_arrow_table())

        return self.source.read_one(rows)


def _plain(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.remove_metadata() for f in schema]).remove_metadata()


def _plain_table(table: pa.Table) -> pa.Table:
    return table.cast(_plain(table.schema))


def _password(secret_name: str | None) -> str | None:
    if not secret_name:
        return None
    try:
        from prefect.blocks.system import Secret

        return Secret.load(secret_name).get()
    except ValueError as exc:
        raise DataError(f"data.password_secret: no Prefect Secret block {secret_name!r} ({exc})") from None


def copy_to_parquet(source: SqlSource, folder: str) -> dict[str, Any]:
    """The query's result, read in one read-only transaction, streamed into Parquet files under folder (a new
    folder of this run's storage); the record of the copy (server, query, rows, files, when). DataError for a query
    with no rows (nothing is left behind)."""
    from trainflow.run.storage import filesystem_for, is_uri, join, with_scheme

    fs, inner = filesystem_for(folder)
    local = not is_uri(folder)
    conn, cursor = source.connect()
    files: list[str] = []
    rows = 0
    writer = None
    started = time.time()
    read = source.guarded(conn, source.batches(cursor))
    try:
        for batch in read:
            if writer is not None and writer.rows >= COPY_ROWS_PER_FILE:
                writer.close()
                writer = None
            if writer is None:
                if not files:
                    fs.create_dir(inner, recursive=True)
                    if local:  # the table's rows: the owner's only, as the record is
                        os.chmod(inner, 0o700)
                path = join(inner, COPY_FILE.format(len(files)))
                writer = _Writer(fs.open_output_stream(path), batch.schema)
                if local:
                    os.chmod(path, 0o600)
                files.append(with_scheme(folder, path))
            writer.write(batch)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
            writer = None
    except BaseException:
        if writer is not None:
            writer.abort()
        if files:
            fs.delete_dir(inner)  # this copy's own new folder: never anything else
        raise
    finally:
        read.close()  # the connection closed, or (a stuck read) by the reading thread once its read returns
    if rows == 0:
        if files:
            fs.delete_dir(inner)
        raise DataError(f"data.{source.key}: {source.describe()} returned no rows")
    return {
        "format": "postgres",
        "server": source.server,
        "query": source.query,
        "table": source.table,
        "rows": rows,
        "location": folder,
        "files": files,
        "copied_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "copy_id": uuid.uuid4().hex[:12],
    }


class _Writer:
    """One Parquet file of the copy: its writer and the stream under it (closed too: an object store's upload
    completes on close)."""

    def __init__(self, stream, schema: pa.Schema):
        import pyarrow.parquet as pq

        self.stream, self.rows = stream, 0
        self.writer = pq.ParquetWriter(stream, schema)

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch, row_group_size=COPY_ROW_GROUP_ROWS)
        self.rows += batch.num_rows

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            self.stream.close()

    def abort(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the copy failed already; its folder is removed next
            pass


class _Guarded:
    """A stream of batches read on a thread of its own, each waited for at most seconds: a read that stops (a frozen
    backend, a host gone without a reset) is cancelled (libpq's cancel request) and raises stalled() instead of
    hanging the run. The connection is closed by whoever holds it last: here, or the reading thread once its stuck
    read returns (libpq's connection is never closed under a read in progress)."""

    _END = object()

    def __init__(self, batches: Iterator[pa.RecordBatch], seconds: float, conn, stalled):
        self.seconds, self.conn, self.stalled = seconds, conn, stalled
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._reading = True
        self._abandoned = False
        self._thread = threading.Thread(target=self._read, args=(batches,), name="trainflow-pg-read", daemon=True)
        self._thread.start()

    def _read(self, batches: Iterator[pa.RecordBatch]) -> None:
        try:
            for batch in batches:
                if not self._put(batch):
                    return
            self._put(self._END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(exc)
        finally:
            with self._lock:
                self._reading = False
                abandoned = self._abandoned
            if abandoned:
                self.conn.close()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                item = self._queue.get(timeout=self.seconds)
            except queue.Empty:
                try:
                    self.conn.adbc_cancel()  # libpq's cancel request: a live backend stops its query
                except Exception:  # noqa: BLE001 - best effort: the read is given up either way
                    pass
                raise self.stalled() from None
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        with self._lock:
            if self._reading:
                self._abandoned = True  # the reading thread closes the connection when its read returns
                return
        self.conn.close()
