"""drift-overhead and skip-unchanged.

drift-overhead: `trainflow predict` of a generated scoring table about 4x Ray's object store
(DRIFT_ROWS, 12M rows x 16 float32 columns + id; store DRIFT_STORE_MB, 200: streamed) with the per-feature drift
against the checkpoint's training baseline (inference.drift.enabled: true, the default) and without it, each in
its own process with its own Ray. Printed: both inference times (ratio; target <= 1.10) and the bytes Ray spilled.

skip-unchanged: the demo (`make demo`'s config on the bundled sample, in a scratch folder) trained once, then run
again on the same data and config, which registers nothing and scores with the champion. Printed: the rerun's wall
time against the full run's (ratio; target <= 0.33).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.beyond_memory import OUT, make_table

ROWS = int(os.environ.get("DRIFT_ROWS", 12_000_000))
STORE = int(os.environ.get("DRIFT_STORE_MB", 200)) * 2**20
REPO = Path(__file__).resolve().parents[1]


def child(checkpoint: str, score: str, work: str, drift: str) -> None:
    """One `trainflow predict` with drift on or off, on a Ray with a small object store; prints a JSON line."""
    from ray._private.internal_api import memory_summary

    from trainflow.flows.cli import main as cli_main
    from trainflow.run.runtime import ensure_ray

    ensure_ray(num_cpus=os.cpu_count(), object_store_memory=STORE)
    cfg = Path(work) / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "data": {"path": score, "label": "y", "id_column": "id"},
                "task": "regression",
                "storage_path": str(Path(work) / "runs"),
                "inference": {
                    "input": score,
                    "output": str(Path(work) / "predictions"),
                    "batch_size": 65536,
                    "drift": {"enabled": drift == "on"},
                },
            }
        )
    )
    t0 = time.perf_counter()
    rc = cli_main(
        ["predict", "--config", str(cfg), "--model", checkpoint, "--summary-json", str(Path(work) / "s.json")]
    )
    wall = time.perf_counter() - t0
    spilled = re.search(r"Spilled (\d+) MiB", memory_summary(stats_only=True))
    summary = json.loads((Path(work) / "s.json").read_text()) if rc == 0 else {}
    print(
        "RESULT "
        + json.dumps(
            {
                "rc": rc,
                "wall": wall,
                "spilled_mib": int(spilled.group(1)) if spilled else 0,
                "rows": summary.get("output_rows"),
                "drifted": (summary.get("drift") or {}).get("drifted_columns"),
            }
        ),
        flush=True,
    )


def _run(*args: str) -> dict:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.drift_overhead", "--child", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        raise RuntimeError(f"drift-overhead child failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(found[-1].removeprefix("RESULT "))


def checkpoint_for(table: Path, directory: Path) -> str:
    """A checkpoint whose preprocessor (and baseline) is fitted on `table`, with an untrained MLP."""
    from bench.inference_throughput import make_checkpoint
    from trainflow.run.runtime import ensure_ray

    ensure_ray(num_cpus=os.cpu_count())
    directory.mkdir(parents=True, exist_ok=True)
    return make_checkpoint(table, str(directory))


def drift_overhead() -> None:
    import ray

    fit = make_table(OUT / f"beyond-{ROWS // 10}.parquet", ROWS // 10, 2)
    score = make_table(OUT / f"drift-score-{ROWS}.parquet", ROWS, 1, label=False)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = checkpoint_for(fit, Path(tmp) / "ckpt")
        ray.shutdown()
        off = _run(checkpoint, str(score), _fresh(Path(tmp) / "off"), "off")
        on = _run(checkpoint, str(score), _fresh(Path(tmp) / "on"), "on")
    assert on["rows"] == off["rows"] == ROWS, (on, off)
    print(
        f"drift-overhead: trainflow {on['wall']:.1f} s, baseline {off['wall']:.1f} s, ratio {on['wall'] / off['wall']:.2f}  "
        f"(predict of {ROWS} streamed rows on a {STORE / 2**20:.0f} MiB store, drift on vs off; spilled "
        f"{on['spilled_mib']} / {off['spilled_mib']} MiB; drifted {on['drifted']}; target ratio <= 1.10)",
        flush=True,
    )


def _fresh(path: Path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def skip_unchanged() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "configs", work / "configs")
        env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        trainflow = [sys.executable, "-m", "trainflow.flows.cli"]
        subprocess.run(
            [*trainflow, "sample", "--out", str(work / "data" / "sample")], check=True, env=env, capture_output=True
        )
        walls = []
        for _ in range(2):
            t0 = time.perf_counter()
            proc = subprocess.run(
                [
                    *trainflow,
                    "retrain",
                    "--config",
                    str(work / "configs" / "demo.yaml"),
                    "--summary-json",
                    str(work / "s.json"),
                ],
                env=env,
                capture_output=True,
                text=True,
                cwd=work,
            )
            walls.append(time.perf_counter() - t0)
            assert proc.returncode == 0, proc.stderr[-3000:]
        skipped = json.loads((work / "s.json").read_text()).get("skipped")
    assert skipped, "the rerun was not skipped"
    print(
        f"skip-unchanged: trainflow {walls[1]:.1f} s, baseline {walls[0]:.1f} s, ratio {walls[1] / walls[0]:.2f}  "
        "(the demo rerun on the champion's data and config, which registers nothing and predicts with the champion, "
        "vs its first full run; target <= 0.33)",
        flush=True,
    )


def main() -> None:
    skip_unchanged()
    drift_overhead()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:])
    else:
        main()
