"""front-door: how long small work takes from the command line, against a bare Python process doing the same.

A model is trained once (the bundled sample, 3,000 rows, the network for 2 epochs) in a scratch folder with no
Prefect API configured, as on a laptop. Then each command runs FRONT_DOOR_REPEATS times (the fastest kept) as a
user runs it, `trainflow ...` in a fresh process:
- front-door-predict: `trainflow predict` of 1,000 scoring rows with the champion;
- front-door-skip: `trainflow retrain` on the champion's own data and config (nothing to train; the champion scores);
- front-door-validate: `trainflow validate`.
The floor, measured in the same run: a fresh Python process that reads the scoring table with pyarrow, loads the
champion's checkpoint as trainflow serves it, predicts and writes the predictions as Parquet.
Target: each within 5 s of the floor on an idle two-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

REPEATS = int(os.environ.get("FRONT_DOOR_REPEATS", 3))

FLOOR = textwrap.dedent("""
    import sys
    import pyarrow.parquet as pq
    from trainflow.trainer.serving.predict import predict_table
    from trainflow.trainer.serving.servable import load_servable

    checkpoint, score, out = sys.argv[1:]
    table = pq.read_table(score)
    pq.write_table(predict_table(load_servable(checkpoint, "cpu"), table, "customer_id"), out)
""")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    return {**env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _timed(args: list[str], cwd: Path) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        proc = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[2:4])} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        best = min(best, wall)
    return best


def main() -> None:
    trainflow = [sys.executable, "-m", "trainflow.flows.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(
            [*trainflow, "sample", "--out", "data", "--rows", "3000", "--score-rows", "1000"],
            cwd=work,
            env=_env(),
            check=True,
            capture_output=True,
        )
        cfg = work / "config.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "data": {"path": "data/train.parquet", "label": "churned", "id_column": "customer_id"},
                    "task": "classification",
                    "model": {"type": "mlp", "params": {"mlp": {"epochs": 2}}},
                    "storage_path": "runs",
                    "mlflow": {"experiment": "front-door", "registered_model": "front-door"},
                    "inference": {"input": "data/score.parquet", "output": "predictions"},
                }
            )
        )
        run = [*trainflow, "retrain", "--config", str(cfg), "--summary-json", str(work / "trained.json")]
        proc = subprocess.run(run, cwd=work, env=_env(), capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"front-door: the first retrain failed: {proc.stderr[-3000:]}")
        checkpoint = json.loads((work / "trained.json").read_text())["best_checkpoint"]["path"]
        floor = _timed(
            [
                sys.executable,
                "-c",
                FLOOR,
                checkpoint,
                str(work / "data" / "score.parquet"),
                str(work / "floor.parquet"),
            ],
            work,
        )
        walls = {
            "predict": _timed([*trainflow, "predict", "--config", str(cfg)], work),
            "skip": _timed(
                [*trainflow, "retrain", "--config", str(cfg), "--summary-json", str(work / "skip.json")], work
            ),
            "validate": _timed([*trainflow, "validate", "--config", str(cfg)], work),
        }
        assert json.loads((work / "skip.json").read_text()).get("skipped"), "the rerun was not skipped"
    what = {
        "predict": "trainflow predict of 1,000 rows with the champion",
        "skip": "trainflow retrain on the champion's data and config (skipped; the champion scores 1,000 rows)",
        "validate": "trainflow validate of a 3,000-row table and its 1,000-row scoring table",
    }
    for name, wall in walls.items():
        print(
            f"front-door-{name}: trainflow {wall:.1f} s, baseline {floor:.1f} s, ratio {wall / floor:.2f}  ({what[name]}, "
            f"fastest of {REPEATS}, vs a bare Python process that reads, predicts and writes the same rows; "
            f"target: within 5 s of it)",
            flush=True,
        )


if __name__ == "__main__":
    main()
