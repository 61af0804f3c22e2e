"""A PostgreSQL query or table (data.sql or data.table on data.connection): copied once per run, in one
transaction, to Parquet files the run then reads (trainflow/tables/postgres.py; tasks/ingest.py pin_source)."""

from __future__ import annotations

from typing import Any

from trainflow.tables.sources.base import Source


class PostgresSource(Source):
    name = "postgres"
    kind = "query"
    describes = "`data.sql` or `data.table` on `data.connection`, copied once per run"
    own_keys = ("sql", "table", "connection", "password_secret", "watermark")
    path_is_location = False  # no path: data.sql or data.table
    copy_format = "parquet"  # what a run's copy is written as (trainflow/tables/postgres.py copy_to_parquet)

    def check(self, data: Any) -> None:
        from trainflow.tables.postgres import check_connection, check_table_name

        if (data.sql is None) == (data.table is None):
            raise ValueError("format postgres: give data.sql (a query) or data.table (a table), one of them")
        if data.path is not None:
            raise ValueError(f"path: a PostgreSQL source is data.sql or data.table, not a path ({data.path!r})")
        if not data.connection:
            raise ValueError("connection: a PostgreSQL source needs postgresql://user@host:port/database")
        check_connection(data.connection)
        if data.table is not None:
            check_table_name(data.table)
        if data.sql is not None and not data.sql.strip().rstrip(";").strip():
            raise ValueError("sql: the query is empty")

    def where(self, data: Any) -> str:
        from trainflow.tables.postgres import server_of

        what = f"table {data.table}" if data.table else "query"
        return f"PostgreSQL {what} on {server_of(data.connection or '')}"

    def dataset(self, data: Any) -> Any:
        """The query as the pyarrow dataset calls of the checks (its schema, columns read alone)."""
        from trainflow.tables.postgres import SqlScan, SqlSource

        return SqlScan(SqlSource.of(data))
