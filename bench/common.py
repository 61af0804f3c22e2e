"""What the benchmarks share: the 2M x 16 table, a local Ray of this machine's size, a line printer."""

from __future__ import annotations

import os
import time
from typing import Any
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = int(os.environ.get("BENCH_ROWS", 2_000_000))
COLS = 16
OUT = Path(__file__).with_name("out")


def make_table(path: Path | None = None, rows: int = ROWS) -> Path:
    """A regression table: 16 float columns (with 1% missing in f0) and a label y; written once."""
    path = path or OUT / f"bench-{rows}.parquet"
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, COLS)).astype(np.float32)
    y = (x[:, :4].sum(axis=1) + 0.5 * np.sin(x[:, 4]) + rng.normal(0, 0.1, rows)).astype(np.float32)
    cols = {f"f{i}": pa.array(x[:, i]) for i in range(COLS)}
    mask = rng.random(rows) < 0.01
    cols["f0"] = pa.array(x[:, 0], mask=mask)
    table = pa.table({"id": np.arange(rows), **cols, "y": y})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=250_000)
    return path


def start_ray() -> None:
    from trainflow.run.runtime import ensure_ray

    ensure_ray(num_cpus=os.cpu_count())  # as trainflow starts it


def best_of(fn, repeats: int = 3) -> tuple[float, Any]:
    """(the fastest of repeats calls' seconds, the last call's answer): the first call warms the libraries' imports
    and the page cache for both sides of a comparison."""
    times, answer = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        answer = fn()
        times.append(time.perf_counter() - started)
    return min(times), answer


def report(name: str, ours: float, baseline: float, unit: str, ratio: float, note: str, digits: int = 2) -> None:
    """digits: of the ratio (the values get one significant figure more)."""
    v = f".{digits + 1}g"
    print(
        f"{name}: trainflow {ours:{v}} {unit}, baseline {baseline:{v}} {unit}, ratio {ratio:.{digits}f}  ({note})",
        flush=True,
    )
