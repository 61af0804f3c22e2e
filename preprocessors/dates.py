"""Date and time columns as numeric parts (fastai's add_datepart): year, month, day, day of week,
day of year, hour and minute where the column has times, and the elapsed days since 1970."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

DATE_PARTS = ["year", "month", "day", "dayofweek", "dayofyear", "elapsed"]
TIME_PARTS = ["hour", "minute"]


def parts_for(t: pa.DataType) -> list[str]:
    """The parts a column of this type gives: a date has no hour or minute."""
    return DATE_PARTS if pa.types.is_date(t) else DATE_PARTS + TIME_PARTS


def looks_like_dates(values: list[str], threshold: float = 0.95) -> bool:
    """Whether nearly every non-empty text value parses as an ISO-8601 date or timestamp."""
    values = [v for v in values if v is not None and str(v).strip()]
    if len(values) < 2:
        return False
    parsed = pd.to_datetime(pd.Series(values, dtype=object), errors="coerce", format="ISO8601", utc=True)
    # plain numbers are not dates, even when pandas could read them as years
    numeric = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").notna()
    return bool(((parsed.notna()) & ~numeric).mean() >= threshold)


def _as_utc_timestamps(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_date(col.type) or pa.types.is_timestamp(col.type):
        if pa.types.is_date(col.type):
            col = pc.cast(col, pa.timestamp("s"))
        series = pd.Series(col.to_pandas(), dtype=object if col.null_count == len(col) else None)
        series = pd.to_datetime(series, errors="coerce")
        return series.dt.tz_localize("UTC") if series.dt.tz is None else series.dt.tz_convert("UTC")
    if pa.types.is_null(col.type):
        return pd.Series(pd.NaT, index=range(len(col)), dtype="datetime64[ns, UTC]")
    # text: values that do not parse become missing (and so get the column's missing indicator)
    return pd.to_datetime(pd.Series(pc.cast(col, pa.string()).to_pandas()), errors="coerce", format="ISO8601", utc=True)


def date_parts(col: pa.ChunkedArray | pa.Array, parts: list[str]) -> dict[str, np.ndarray]:
    """{part: float64 array, NaN where the value is missing or not a date}."""
    ts = _as_utc_timestamps(col)
    out = {}
    for part in parts:
        if part == "elapsed":
            values = ((ts - pd.Timestamp(0, tz="UTC")).dt.total_seconds() / 86400.0).to_numpy(
                dtype=np.float64, na_value=np.nan
            )
        elif part == "dayofweek":
            values = ts.dt.dayofweek.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            values = getattr(ts.dt, part).to_numpy(dtype=np.float64, na_value=np.nan)
        out[part] = np.where(ts.isna().to_numpy(), np.nan, values)
    return out
