"""beyond-memory and scale-linearity: training and scoring tables larger than Ray's object store.

beyond-memory: a local Ray with a small object store (BEYOND_MEMORY_STORE_MB, 200) and a generated Parquet
table about 4x that in memory (BEYOND_MEMORY_ROWS, 12M rows x 16 float32 columns + id + label): `trainflow
retrain` trains 2 epochs with 2 workers (data.materialize: auto, which streams it) and predicts a scoring
table of a tenth the rows. The same table then trains on a Ray whose object store holds it (auto
materializes it there). Printed: the streamed steady-state epoch's rows/s against the in-memory run's
(ratio; target >= 0.7), the wall times, and the bytes Ray spilled (target below the table's size).

scale-linearity: the streamed path's steady-state epoch on a tenth of the rows against the full table, on
the same small store (target: 10x the rows costs <= 11x the time).

beyond-memory-xgboost: the same streamed table (small store) trained by XGBoost with 2 workers for
BEYOND_MEMORY_ROUNDS (30) rounds, early stopping off, once on external-memory matrices
(model.params.external_memory: always) and once in memory (never). Printed: seconds per round of each
(ratio), the largest resident memory of a Ray Train worker process in each (sampled every 0.2 s), and
both validation RMSEs (the same trees: equal).

Each run is its own process with its own Ray, so the object store size is what the run sees.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

ROWS = int(os.environ.get("BEYOND_MEMORY_ROWS", 12_000_000))
SMALL_STORE = int(os.environ.get("BEYOND_MEMORY_STORE_MB", 200)) * 2**20
COLS = 16
ROUNDS = int(os.environ.get("BEYOND_MEMORY_ROUNDS", 30))
OUT = Path(__file__).with_name("out")


def make_table(path: Path, rows: int, seed: int, label: bool = True) -> Path:
    """Written in row groups of 250k rows, never held whole in memory."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    writer = None
    for start in range(0, rows, 250_000):
        n = min(250_000, rows - start)
        x = rng.normal(size=(n, COLS)).astype(np.float32)
        cols = {"id": np.arange(start, start + n), **{f"f{i}": x[:, i] for i in range(COLS)}}
        if label:
            cols["y"] = (x[:, :4].sum(axis=1) + 0.5 * np.sin(x[:, 4]) + rng.normal(0, 0.1, n)).astype(np.float32)
        t = pa.table(cols)
        writer = writer or pq.ParquetWriter(str(path) + ".tmp", t.schema)
        writer.write_table(t)
    writer.close()
    os.replace(str(path) + ".tmp", path)
    return path


class PeakWorkerMemory:
    """The largest resident set of any Ray Train worker process, sampled every 0.2 s in a thread."""

    def __init__(self):
        import threading

        self.peak, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        import psutil

        while not self.done.wait(0.2):
            for proc in psutil.process_iter(["name", "cmdline", "memory_info"]):
                title = " ".join(proc.info["cmdline"] or []) + (proc.info["name"] or "")
                if "RayTrainWorker" in title and proc.info["memory_info"] is not None:
                    self.peak = max(self.peak, proc.info["memory_info"].rss)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def child(store: int, train: str, score: str, work: str, model: dict | None = None) -> None:
    """One retrain in this process, on a Ray with an object store of `store` bytes; prints a JSON line.
    model: the config's model section (default: trainflow's mlp)."""
    from ray._private.internal_api import memory_summary

    from trainflow.flows.cli import main as cli_main
    from trainflow.runtime import ensure_ray

    ensure_ray(num_cpus=os.cpu_count(), object_store_memory=store)
    cfg = Path(work) / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"path": train, "label": "y", "id_column": "id"}, "task": "regression",
        "train": {"epochs": 2, "batch_size": 1024}, "scaling": {"num_workers": 2},
        "checkpoint": {"metric": "val_rmse", "min_interval_s": 0}, "storage_path": str(Path(work) / "runs"),
        "model": model or {"type": "mlp"},
        "mlflow": {"experiment": "beyond-memory", "registered_model": f"beyond-{Path(work).name}"},
        "inference": {"input": score, "output": str(Path(work) / "predictions"), "batch_size": 65536},
    }))
    t0, memory = time.perf_counter(), PeakWorkerMemory()
    rc = cli_main(["retrain", "--config", str(cfg), "--summary-json", str(Path(work) / "summary.json")])
    wall, peak = time.perf_counter() - t0, memory.stop()
    spilled = re.search(r"Spilled (\d+) MiB", memory_summary(stats_only=True))
    summary = json.loads((Path(work) / "summary.json").read_text()) if rc == 0 else {}
    from trainflow.trainer.checkpoint import read_metrics
    from trainflow.trainer.runner import checkpoints_on_disk

    # every epoch is in the last checkpoint's history (the best one's stops at its own epoch)
    history = read_metrics(checkpoints_on_disk(summary["ray_run_path"])[-1]["path"])["history"] if summary else []
    print("RESULT " + json.dumps({
        "rc": rc, "wall": wall, "spilled_mib": int(spilled.group(1)) if spilled else 0,
        "materialized": summary.get("data_materialized"), "train_rows": summary.get("train_rows"),
        "epoch_times": [h["epoch_time_s"] for h in history], "output_rows": summary.get("output_rows"),
        "input_rows": summary.get("input_rows"), "peak_worker_rss_mib": peak / 2**20,
        "val_rmse": (summary.get("best_checkpoint") or {}).get("metrics", {}).get("val_rmse"),
    }), flush=True)


def run(store: int, train: Path, score: Path, work: Path, model: dict | None = None) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.run([sys.executable, "-m", "bench.beyond_memory", "--child", str(store), str(train), str(score), str(work),
                           json.dumps(model or {})], capture_output=True, text=True, env=env, timeout=3600)
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        raise RuntimeError(f"beyond-memory child failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(found[-1].removeprefix("RESULT "))


def main() -> None:
    train = make_table(OUT / f"beyond-{ROWS}.parquet", ROWS, 0)
    small = make_table(OUT / f"beyond-{ROWS // 10}.parquet", ROWS // 10, 2)
    score = make_table(OUT / f"beyond-score-{ROWS // 10}.parquet", ROWS // 10, 1, label=False)
    table_mib = sum(pq.ParquetFile(train).metadata.row_group(i).total_byte_size
                    for i in range(pq.ParquetFile(train).metadata.num_row_groups)) / 2**20
    with tempfile.TemporaryDirectory(prefix="trainflow-beyond-") as tmp:
        streamed = run(SMALL_STORE, train, score, Path(tmp) / "streamed")
        tenth = run(SMALL_STORE, small, score, Path(tmp) / "tenth")
        held = run(int(table_mib * 2**20 * 5), train, score, Path(tmp) / "in-memory")
        trees = {mode: run(SMALL_STORE, train, score, Path(tmp) / f"xgboost-{mode}", {"type": "xgboost", "params": {
            "num_boost_round": ROUNDS, "early_stopping_rounds": "off", "external_memory": mode}})
            for mode in ("always", "never")}
    rate = lambda r: r["train_rows"] / r["epoch_times"][-1]  # noqa: E731 - the steady-state (second) epoch
    print(
        f"beyond-memory: trainflow {rate(streamed) / 1e6:.3f} M rows/s, baseline {rate(held) / 1e6:.3f} M rows/s, "
        f"ratio {rate(streamed) / rate(held):.2f}  ({ROWS} rows, {table_mib:.0f} MiB in memory, object store "
        f"{SMALL_STORE / 2**20:.0f} MiB vs {table_mib * 5:.0f} MiB; materialized {streamed['materialized']} vs "
        f"{held['materialized']}; wall {streamed['wall']:.0f} s vs {held['wall']:.0f} s incl. {streamed['output_rows']} "
        f"predictions; spilled {streamed['spilled_mib']} MiB vs {held['spilled_mib']} MiB; epochs "
        f"{[round(t, 1) for t in streamed['epoch_times']]} vs {[round(t, 1) for t in held['epoch_times']]} s; "
        f"targets: ratio >= 0.7, spilled < {table_mib:.0f} MiB)", flush=True)
    a, b = streamed["epoch_times"][-1], tenth["epoch_times"][-1]
    print(f"scale-linearity: trainflow {a:.1f} s, baseline {b:.1f} s, ratio {a / b:.2f}  (steady-state streamed epoch "
          f"of {ROWS} rows vs {ROWS // 10} rows on a {SMALL_STORE / 2**20:.0f} MiB object store; target <= 11)", flush=True)
    # a booster's "epoch" is a round; its first holds the matrices' construction, so the rest are compared
    per_round = {m: sum(r["epoch_times"][1:]) / max(1, len(r["epoch_times"]) - 1) for m, r in trees.items()}
    ext, mem = trees["always"], trees["never"]
    print(f"beyond-memory-xgboost: trainflow {per_round['always']:.2f} s/round, baseline {per_round['never']:.2f} s/round, "
          f"ratio {per_round['always'] / per_round['never']:.2f}  (external-memory vs in-memory matrices, {ROWS} rows "
          f"streamed on a {SMALL_STORE / 2**20:.0f} MiB object store, 2 workers, rounds 2-{ROUNDS}; largest worker "
          f"RSS {ext['peak_worker_rss_mib']:.0f} MiB vs {mem['peak_worker_rss_mib']:.0f} MiB; val_rmse {ext['val_rmse']:.4f} "
          f"vs {mem['val_rmse']:.4f}; wall {ext['wall']:.0f} s vs {mem['wall']:.0f} s incl. "
          f"{ext['output_rows']} predictions)", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], json.loads(sys.argv[6]) or None)
    else:
        main()
