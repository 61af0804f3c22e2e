"""A realistic synthetic churn table: numeric and text columns, missing values, a learnable label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainflow.run.storage import replace_bytes

PLANS = ["basic", "standard", "premium"]
REGIONS = ["north", "south", "east", "west", "central"]
CONTRACTS = ["month-to-month", "one year", "two year"]


def make_churn_table(rows: int, seed: int, with_label: bool = True, id_offset: int = 0) -> pa.Table:
    """Customers with usage features; churn depends non-linearly on contract, tenure, charges and calls."""
    rng = np.random.default_rng(seed)
    tenure = rng.gamma(2.0, 12.0, rows).clip(0, 72)
    plan = rng.choice(PLANS, rows, p=[0.5, 0.35, 0.15])
    contract = rng.choice(CONTRACTS, rows, p=[0.55, 0.25, 0.20])
    region = rng.choice(REGIONS, rows)
    base = np.select([plan == "basic", plan == "standard"], [30.0, 60.0], 95.0)
    charges = base + rng.normal(0, 8, rows)
    calls = rng.poisson(1.0 + 2.0 * (plan == "basic"), rows)
    age = rng.normal(45, 14, rows).clip(18, 90).round()
    logit = (
        -1.0
        + 1.6 * (contract == "month-to-month")
        - 0.9 * (contract == "two year")
        - 0.045 * tenure
        + 0.018 * (charges - 60)
        + 0.45 * calls
        - 0.25 * (region == "central")
        + 0.6 * np.sin(age / 8.0)
    )
    churned = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)

    def with_missing(values: np.ndarray, frac: float) -> pa.Array:
        mask = rng.random(rows) < frac
        return pa.array(values, mask=mask)

    cols = {
        "customer_id": pa.array(np.arange(id_offset, id_offset + rows, dtype=np.int64)),
        "age": with_missing(age, 0.03),
        "tenure (months)": pa.array(tenure.round(1)),
        "monthly charges ($)": with_missing(charges.round(2), 0.02),
        "support calls": pa.array(calls.astype(np.int64)),
        "plan": pa.array(plan),
        "contract type": pa.array(contract),
        "region": with_missing(region.astype(object), 0.05),
    }
    if with_label:
        cols["churned"] = pa.array(churned)
    return pa.table(cols)


def _write(table: pa.Table, path: Path) -> None:
    """The table as one Parquet file, written whole (storage.replace_bytes): a few MB, built in memory."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=25_000)
    replace_bytes(str(path.resolve()), sink.getvalue().to_pybytes())


def write_sample(
    out: str | Path, rows: int = 100_000, score_rows: int = 20_000, seed: int = 7, force: bool = False
) -> list[Path]:
    """Write train.parquet (with label) and score.parquet (ids, no label) under out, unless present."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train, score = out / "train.parquet", out / "score.parquet"
    if force or not train.exists():
        _write(make_churn_table(rows, seed), train)
    if force or not score.exists():
        _write(make_churn_table(score_rows, seed + 1, with_label=False, id_offset=10_000_000), score)
    return [train, score]
