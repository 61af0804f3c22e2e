"""The data sections: the table (data, data.csv), its preprocessing and the split of its rows into roles."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    PrivateAttr,
    field_validator,
    model_validator,
)

from trainflow.config.base import _Section, key
from trainflow.roles.folds import EXACT_TEST_ROWS, MAX_TEST_ROWS
from trainflow.tables.sources import SOURCES, FileSource, for_keys, source
from trainflow.tables.sources import infer_format as infer_format  # trainflow.config's: a path's format by its name


FormatName = Literal[tuple(SOURCES)]  # data.format: a name of the sources' registry


def _formats_doc() -> str:
    """data.format's meaning, from the sources' registry (trainflow/tables/sources/)."""
    return ", ".join(f"`{s.name}` ({s.describes})" for s in SOURCES.values())


def _inferred_doc() -> str:
    files = [s for s in SOURCES.values() if isinstance(s, FileSource)]
    return ", ".join(f"`{s.extensions[0]}` → {s.name}" for s in files[1:]) + f", else {files[0].name}"


def _extensions_doc() -> str:
    return ", ".join(f"`{e}`" for s in SOURCES.values() if isinstance(s, FileSource) for e in s.extensions)


class CsvSection(_Section):
    """How CSV files are parsed (pyarrow.csv): a delimiter, a quote character and the text encoding."""

    delimiter: str = key(",", 'the character between a CSV file\'s values (a tab: `"\\t"`)', min_length=1, max_length=1)
    quote_char: str = key(
        '"', "the character that quotes a CSV value holding the delimiter", min_length=1, max_length=1
    )
    encoding: str = key("utf8", "the CSV files' text encoding, e.g. `latin-1`, `cp1252`")

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, v: str) -> str:
        import codecs

        try:
            codecs.lookup(v)
        except LookupError:
            raise ValueError(f"unknown text encoding {v!r} (e.g. utf8, latin-1, cp1252)") from None
        return v


class DataSection(_Section):
    path: str | None = key(
        None,
        "file, folder, glob or URI (`s3://...`) of the training table; files are picked by their "
        f"extension ({_extensions_doc()}, optionally compressed); a Delta table's folder "
        "(`format: delta`); an Iceberg table's identifier, `namespace.table` (`format: iceberg`)",
        shown="required, but for a PostgreSQL source (`data.sql` or `data.table`)",
    )
    format: FormatName | None = key(
        None,
        f"{_formats_doc()}; a Delta or Iceberg table is read at one snapshot, a PostgreSQL source copied once per "
        "run, recorded with the run ([sources.md](sources.md))",
        shown=f"from the extension ({_inferred_doc()}); postgres with `data.sql` or `data.table`",
    )
    catalog: dict[str, Any] | None = key(
        None,
        "`format: iceberg`: the pyiceberg catalog's properties, e.g. `{uri: sqlite:////data/catalog.db, "
        "warehouse: file:///data/warehouse}` (its `type` defaults to `sql`, pyiceberg's SQL catalog); values of "
        "credential-like keys are masked wherever the config is shown or logged",
    )
    snapshot: int | None = key(
        None,
        "`format: delta` or `iceberg`: the table version (Delta) or snapshot id (Iceberg) to read, e.g. last "
        "Tuesday's; a rerun of a run name reads what its first attempt read",
        shown="the table's current one when the run starts",
    )
    sql: str | None = key(
        None,
        "a PostgreSQL query whose rows are the training table (one read-only transaction, copied once to the run's "
        "storage as Parquet: a rerun of the run name reads that copy)",
    )
    table: str | None = key(None, "a PostgreSQL table, `name` or `schema.name`: every row of it (as `data.sql`)")
    connection: str | None = key(
        None,
        "with `data.sql` or `data.table`: `postgresql://user@host:port/database`, never with a password (PGPASSWORD, "
        "~/.pgpass or `data.password_secret`)",
    )
    password_secret: str | None = key(
        None,
        "the name of a Prefect Secret block holding the PostgreSQL password",
        shown="none: libpq's PGPASSWORD or ~/.pgpass",
    )
    watermark: str | None = key(
        None,
        "a PostgreSQL source: the column whose maximum the watch deployment compares between looks (a new maximum "
        "is new data)",
        shown="the row count",
    )
    csv: CsvSection = key(doc="how CSV files are parsed (pyarrow.csv)", default_factory=CsvSection)
    label: str = key(doc="label column (any name, spaces and punctuation allowed)")
    features: list[str] | None = key(
        None, "feature columns: numbers, text, dates/timestamps", shown="every column but label and id"
    )
    id_column: str | None = key(
        None, "carried into the predictions; also the split's key when given (not `prediction` or `proba_*`)"
    )
    materialize: Literal["auto", "always", "never"] = key(
        "auto",
        "keep the table in Ray's object store (`always`) or stream it from its files every epoch (`never`); "
        "`auto`: materialize when its in-memory size (from the files' metadata) is under a quarter of the store "
        "([pipeline.md](pipeline.md))",
    )

    _not_features: set[str] = PrivateAttr(default_factory=set)  # split.group_column (Config sets it)
    # a PostgreSQL source once copied (pin_source): the copy's record; path is then the copy's folder
    _copied_from: dict[str, Any] | None = PrivateAttr(default=None)

    @property
    def copied_from(self) -> dict[str, Any] | None:
        return self._copied_from

    @property
    def where(self) -> str:
        """What messages name the table by: its path, or a PostgreSQL source's server and query."""
        return source(self.format).where(self)

    def as_copy(self, record: dict[str, Any]) -> DataSection:
        """This PostgreSQL source as its copy: the Parquet files record names, read like any Parquet folder."""
        copy = self.model_copy(
            update={
                "path": record["location"],
                "format": source(self.format).copy_format,
                "sql": None,
                "table": None,
                "connection": None,
                "password_secret": None,
                "watermark": None,
            }
        )
        copy._copied_from = {k: v for k, v in record.items() if k != "files"}
        return copy

    def default_features(self, names: list[str]) -> list[str]:
        """The feature columns: data.features, else every column of names but the label, the id and the split's group."""
        skip = {self.label, self.id_column, *self._not_features}
        return list(self.features) if self.features else [c for c in names if c not in skip]

    @model_validator(mode="after")
    def _infer_format(self) -> DataSection:
        """The format from the keys set (a query's) or the path's extension; its own checks; no key of another
        format's."""
        given = {k for s in SOURCES.values() for k in s.own_keys if getattr(self, k) is not None}
        if self.format is None:
            inferred = for_keys(given) or (infer_format(self.path) if self.path is not None else None)
            if inferred is None:
                raise ValueError("path: required (a file, folder, glob or URI; or data.sql/data.table on PostgreSQL)")
            self.format = inferred  # (validated again as assigned: the checks below run then too)
        src = source(self.format)
        for name in sorted(given - set(src.own_keys)):
            owners = " or ".join(s.name for s in SOURCES.values() if name in s.own_keys)
            raise ValueError(f"{name}: a key of format {owners}; the format is {self.format}")
        src.check(self)
        return self

    @model_validator(mode="after")
    def _check_columns(self) -> DataSection:
        """data.features, the label and the id column name distinct columns the predictions do not."""
        if self.features is not None:
            if not self.features:
                raise ValueError("features: give at least one column, or leave it out to use every column")
            for bad in (self.label, self.id_column):
                if bad is not None and bad in self.features:
                    raise ValueError(f"features: {bad!r} is the label or id column and cannot be a feature")
            if len(set(self.features)) != len(self.features):
                raise ValueError("features: a column is listed twice")
        if self.id_column is not None and self.id_column == self.label:
            raise ValueError(f"id_column: {self.id_column!r} is also the label")
        if self.id_column is not None and (self.id_column == "prediction" or self.id_column.startswith("proba_")):
            raise ValueError(
                f"id_column: {self.id_column!r} is a name the predictions use for their own columns "
                "(prediction, proba_<class>); rename the column"
            )
        return self


class PreprocessSection(_Section):
    """How text and date columns become features."""

    max_onehot: int = key(
        16, "text columns with at most this many distinct values are one-hot; wider ones get a learned embedding", ge=1
    )
    min_frequency: int = key(
        5, "embedded columns: values seen fewer times share the unknown code with unseen ones", ge=1
    )
    max_categories: int = key(100_000, "embedded columns keep at most this many (most frequent) values", ge=1)
    parse_dates: bool = key(True, "text columns whose values parse as ISO-8601 dates or timestamps become date parts")


class SplitSection(_Section):
    test_fraction: float = key(
        0.2,
        "fraction of rows in the test role, read once by the final scoring and the gate, 0 <= f < 1, at most "
        f"{MAX_TEST_ROWS:,} rows; a seeded hash of each row's id (or of its values) decides, so a table of over "
        f"{EXACT_TEST_ROWS:,} rows that grows keeps its test rows; 0: no test role",
        ge=0.0,
        lt=1.0,
    )
    validation_fraction: float = key(
        0.2,
        "fraction of the non-test rows held out for early stopping, the family choice, the ensemble's weights and "
        "calibration when `train.folds` is 1, 0 < f < 1; a class with too few rows for a role keeps them in "
        "training",
        gt=0.0,
        lt=1.0,
    )
    seed: int = key(42, "seeds the split and training")
    time_column: str | None = key(
        None,
        "a date, datetime or numeric column: the test role is then the newest rows (the last `test_fraction` of "
        "them in time), validation the newest before them, training the rest (cross-fitting: blocks of time); "
        "rows of one time are never split between roles; a missing time is refused "
        "([pipeline.md](pipeline.md#roles-by-time-and-by-group))",
        shown="none: roles by a seeded hash of each row's id or values",
    )
    group_column: str | None = key(
        None,
        "rows of one group (customer, patient, store) stay in one role and fold: a model is judged on groups it "
        "never saw; not a feature unless `data.features` names it. With `time_column` the time cut decides, and "
        "the groups it splits are counted",
    )
    backtest_fit: bool = key(
        True,
        "with `time_column`: the backtest trains the chosen family once more, cut off one validation block "
        "earlier, and scores both on the test rows (how much quality a model's age costs; one extra fit within "
        "the time budget); false: the backtest by test-row age only "
        "([pipeline.md](pipeline.md#the-backtest))",
    )
