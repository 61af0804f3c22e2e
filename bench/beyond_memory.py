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

beyond-memory-default: the default config (model.type auto, train.time_limit auto) on the streamed table
(BEYOND_MEMORY_DEFAULT_ROWS, ROWS by default; small store) against each family alone with its defaults, each given at
most half the default's wall time: the ratio is the default's wall over the fastest family's (target <= 2). Alone:
`python -m bench.beyond_memory --default`.

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
DEFAULT_ROWS = int(os.environ.get("BEYOND_MEMORY_DEFAULT_ROWS", ROWS))
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
    model: the config's model section (default: trainflow's mlp with 2 epochs of 1,024 rows a batch, a checkpoint every
    epoch; {"default": 1}: the default config's model, train and checkpoint timing, {"default": 1, "type": F}: family
    F alone with its defaults)."""
    from ray._private.internal_api import memory_summary

    from trainflow.flows.cli import main as cli_main
    from trainflow.run.runtime import ensure_ray

    ensure_ray(num_cpus=os.cpu_count(), object_store_memory=store)
    cfg = Path(work) / "config.yaml"
    default = bool((model or {}).pop("default", False))
    cfg.write_text(
        yaml.safe_dump(
            {
                "data": {"path": train, "label": "y", "id_column": "id"},
                "task": "regression",
                "scaling": {"num_workers": 2},
                "checkpoint": {"metric": "val_rmse", **({} if default else {"min_interval_s": 0})},
                "storage_path": str(Path(work) / "runs"),
                "model": model
                or ({} if default else {"type": "mlp", "params": {"mlp": {"epochs": 2, "batch_size": 1024}}}),
                "mlflow": {"experiment": "beyond-memory", "registered_model": f"beyond-{Path(work).name}"},
                "inference": {"input": score, "output": str(Path(work) / "predictions"), "batch_size": 65536},
            }
        )
    )
    t0, memory = time.perf_counter(), PeakWorkerMemory()
    rc = cli_main(["retrain", "--config", str(cfg), "--summary-json", str(Path(work) / "summary.json")])
    wall, peak = time.perf_counter() - t0, memory.stop()
    spilled = re.search(r"Spilled (\d+) MiB", memory_summary(stats_only=True))
    summary = json.loads((Path(work) / "summary.json").read_text()) if rc == 0 else {}
    from trainflow.trainer.serving.checkpoint import read_metrics
    from trainflow.trainer.runner import checkpoints_on_disk

    # every epoch is in the last checkpoint's history (the best one's stops at its own epoch)
    on_disk = checkpoints_on_disk(summary["ray_run_path"]) if summary else []  # none for an ensemble's run
    history = read_metrics(on_disk[-1]["path"])["history"] if on_disk else []
    print(
        "RESULT "
        + json.dumps(
            {
                "rc": rc,
                "wall": wall,
                "spilled_mib": int(spilled.group(1)) if spilled else 0,
                "materialized": summary.get("data_materialized"),
                "train_rows": summary.get("train_rows"),
                "epoch_times": [h["epoch_time_s"] for h in history],
                "output_rows": summary.get("output_rows"),
                "input_rows": summary.get("input_rows"),
                "peak_worker_rss_mib": peak / 2**20,
                "val_rmse": (summary.get("best_checkpoint") or {}).get("metrics", {}).get("val_rmse"),
                "test_rmse": (summary.get("test_metrics") or {}).get("test_rmse"),
                "family": summary.get("model_family"),
                "time_budget": summary.get("time_budget"),
                "left_out": summary.get("families_left_out"),
                "candidates": [(c["family"], c.get("test_rmse")) for c in summary.get("candidates") or []],
            }
        ),
        flush=True,
    )


def run(
    store: int, train: Path, score: Path, work: Path, model: dict | None = None, timeout: float = 3600
) -> dict | None:
    """One child retrain; None when it ran past timeout (its process group, Ray's processes included, killed)."""
    import signal

    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.beyond_memory",
            "--child",
            str(store),
            str(train),
            str(score),
            str(work),
            json.dumps(model or {}),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)
        return None
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        raise RuntimeError(f"beyond-memory child failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(found[-1].removeprefix("RESULT "))


def default_vs_fastest(rows: int) -> None:
    """beyond-memory-default: the default config (model.type auto, train.time_limit auto) on a table larger than the
    object store, against each family alone with its defaults on the same table, each given at most half the
    default's wall time (so a family that finishes is one that makes the ratio exceed 2; none finishing: the ratio is
    below 2 whatever their times)."""
    train = make_table(OUT / f"beyond-{rows}.parquet", rows, 0)
    score = make_table(OUT / f"beyond-score-{rows // 10}.parquet", rows // 10, 1, label=False)
    with tempfile.TemporaryDirectory(prefix="trainflow-beyond-") as tmp:
        auto = run(SMALL_STORE, train, score, Path(tmp) / "default", {"default": 1})
        alone = {
            f: run(SMALL_STORE, train, score, Path(tmp) / f, {"default": 1, "type": f}, timeout=auto["wall"] / 2)
            for f in ("mlp", "xgboost", "lightgbm", "catboost")
        }
    done = {f: r for f, r in alone.items() if r is not None and r["rc"] == 0}
    fastest = min(done, key=lambda f: done[f]["wall"]) if done else None
    base = done[fastest]["wall"] if fastest else auto["wall"] / 2
    alone_s = ", ".join(
        f"{f} {r['wall']:.0f} s (test_rmse {r['test_rmse']:.4f})"
        if r and r["rc"] == 0
        else f"{f} > {auto['wall'] / 2:.0f} s (stopped)"
        if r is None
        else f"{f} failed rc {r['rc']}"
        for f, r in alone.items()
    )
    budget = auto.get("time_budget") or {}
    print(
        f"beyond-memory-default: trainflow {auto['wall']:.0f} s, baseline {'' if fastest else '> '}{base:.0f} s, "
        f"ratio {'' if fastest else '< '}{auto['wall'] / base:.2f}  (the default config vs the fastest family alone "
        f"({fastest or 'none finished in half the time'}), {rows} rows on a {SMALL_STORE / 2**20:.0f} MiB object "
        f"store, wall incl. {auto['output_rows']} predictions; default won {auto['family']} test_rmse "
        f"{auto['test_rmse']:.4f}, candidates {auto['candidates']}, left out {auto['left_out']}, training "
        f"{budget.get('training_s')} s, {budget.get('rule')}, cut short {budget.get('cut_short')}; alone: {alone_s}; "
        f"target ratio <= 2)",
        flush=True,
    )


def main() -> None:
    train = make_table(OUT / f"beyond-{ROWS}.parquet", ROWS, 0)
    small = make_table(OUT / f"beyond-{ROWS // 10}.parquet", ROWS // 10, 2)
    score = make_table(OUT / f"beyond-score-{ROWS // 10}.parquet", ROWS // 10, 1, label=False)
    table_mib = (
        sum(
            pq.ParquetFile(train).metadata.row_group(i).total_byte_size
            for i in range(pq.ParquetFile(train).metadata.num_row_groups)
        )
        / 2**20
    )
    with tempfile.TemporaryDirectory(prefix="trainflow-beyond-") as tmp:
        streamed = run(SMALL_STORE, train, score, Path(tmp) / "streamed")
        tenth = run(SMALL_STORE, small, score, Path(tmp) / "tenth")
        held = run(int(table_mib * 2**20 * 5), train, score, Path(tmp) / "in-memory")
        trees = {
            mode: run(
                SMALL_STORE,
                train,
                score,
                Path(tmp) / f"xgboost-{mode}",
                {
                    "type": "xgboost",
                    "params": {"num_boost_round": ROUNDS, "early_stopping_rounds": "off", "external_memory": mode},
                },
            )
            for mode in ("always", "never")
        }
    rate = lambda r: r["train_rows"] / r["epoch_times"][-1]  # noqa: E731 - the steady-state (second) epoch
    print(
        f"beyond-memory: trainflow {rate(streamed) / 1e6:.3f} M rows/s, baseline {rate(held) / 1e6:.3f} M rows/s, "
        f"ratio {rate(streamed) / rate(held):.2f}  ({ROWS} rows, {table_mib:.0f} MiB in memory, object store "
        f"{SMALL_STORE / 2**20:.0f} MiB vs {table_mib * 5:.0f} MiB; materialized {streamed['materialized']} vs "
        f"{held['materialized']}; wall {streamed['wall']:.0f} s vs {held['wall']:.0f} s incl. {streamed['output_rows']} "
        f"predictions; spilled {streamed['spilled_mib']} MiB vs {held['spilled_mib']} MiB; epochs "
        f"{[round(t, 1) for t in streamed['epoch_times']]} vs {[round(t, 1) for t in held['epoch_times']]} s; "
        f"targets: ratio >= 0.7, spilled < {table_mib:.0f} MiB)",
        flush=True,
    )
    a, b = streamed["epoch_times"][-1], tenth["epoch_times"][-1]
    print(
        f"scale-linearity: trainflow {a:.1f} s, baseline {b:.1f} s, ratio {a / b:.2f}  (steady-state streamed epoch "
        f"of {ROWS} rows vs {ROWS // 10} rows on a {SMALL_STORE / 2**20:.0f} MiB object store; target <= 11)",
        flush=True,
    )
    # a booster's "epoch" is a round; its first holds the matrices' construction, so the rest are compared
    per_round = {m: sum(r["epoch_times"][1:]) / max(1, len(r["epoch_times"]) - 1) for m, r in trees.items()}
    ext, mem = trees["always"], trees["never"]
    print(
        f"beyond-memory-xgboost: trainflow {per_round['always']:.2f} s/round, baseline {per_round['never']:.2f} s/round, "
        f"ratio {per_round['always'] / per_round['never']:.2f}  (external-memory vs in-memory matrices, {ROWS} rows "
        f"streamed on a {SMALL_STORE / 2**20:.0f} MiB object store, 2 workers, rounds 2-{ROUNDS}; largest worker "
        f"RSS {ext['peak_worker_rss_mib']:.0f} MiB vs {mem['peak_worker_rss_mib']:.0f} MiB; val_rmse {ext['val_rmse']:.4f} "
        f"vs {mem['val_rmse']:.4f}; wall {ext['wall']:.0f} s vs {mem['wall']:.0f} s incl. "
        f"{ext['output_rows']} predictions)",
        flush=True,
    )
    default_vs_fastest(DEFAULT_ROWS)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], json.loads(sys.argv[6]) or None)
    elif len(sys.argv) > 1 and sys.argv[1] == "--default":  # beyond-memory-default alone
        default_vs_fastest(DEFAULT_ROWS)
    else:
        main()
