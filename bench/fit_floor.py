"""fit-floor: what one Ray Train fit costs before any training, on a Ray that trainflow starts itself.

Each side runs in a fresh process with its own local Ray, started as trainflow starts it (`ensure_ray`), then
FIT_FLOOR_FITS back-to-back one-worker `TorchTrainer` fits of a loop that reports once (the first of them is left
out: its worker pool is cold). trainflow: its own settings (the controller polls every 0.2 s on a local Ray);
baseline: the same with Ray's default poll (`RAY_TRAIN_HEALTH_CHECK_INTERVAL_S` 2 s) set in the job's runtime_env,
as a user's own key would be. Reported: the median fit.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

from bench.common import report

FITS = int(os.environ.get("FIT_FLOOR_FITS", 6))

FITS_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from trainflow.run.runtime import ensure_ray

    poll, fits, storage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    env = {"env_vars": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": poll}} if poll else None
    ensure_ray(num_cpus=os.cpu_count(), runtime_env=env)
    time.sleep(5)  # the local Ray's own start-up settles

    def loop(config):
        import ray.train
        ray.train.report({"done": 1})

    walls = []
    for i in range(fits):
        t0 = time.perf_counter()
        TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=1),
                     run_config=RunConfig(name=f"floor-{i}", storage_path=storage)).fit()
        walls.append(time.perf_counter() - t0)
    print(json.dumps(walls[1:]))
""")


def _fits(poll: str) -> list[float]:
    with tempfile.TemporaryDirectory() as storage:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        proc = subprocess.run(
            [sys.executable, "-c", FITS_SCRIPT, poll, str(FITS), storage],
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"fit-floor failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ours, baseline = _fits(""), _fits("2.0")
    a, b = statistics.median(ours), statistics.median(baseline)
    report(
        "fit-floor",
        a,
        b,
        "s",
        a / b,
        f"median one-worker TorchTrainer fit of a loop that reports once, {len(ours)} "
        f"fits each on a warm local Ray; trainflow's poll of 0.2 s vs Ray's default 2 s; all: "
        f"{', '.join(f'{w:.1f}' for w in ours)} vs {', '.join(f'{w:.1f}' for w in baseline)}",
    )


if __name__ == "__main__":
    main()
