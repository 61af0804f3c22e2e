"""outage-soak: the demo's retrain against an `mlflow server` and a `prefect server start` on loopback, with each
stopped for OUTAGE_S seconds (180 by default: `python -m bench outage-soak` reads TRAINFLOW_OUTAGE_S) once training
has begun, against the same retrain with both up, in the same run (TRAINFLOW_OUTAGE_SERVICES=prefect: that one only).

Each outage run must exit 0 with one registered model version and its predictions written; the figure is its time
against the baseline's (the ratio says how much of the outage the run spent waiting rather than working on). The
tests do the same in seconds (tests/test_outages.py); this is the long version a client's own retries do not cover.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"


def _retrain(tmp: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "trainflow"),
            "retrain",
            "--config",
            str(REPO / "configs" / "demo.yaml"),
            "--set",
            "model.type=[mlp, xgboost]",
            "--set",
            f"storage_path={tmp}/{name}/runs",
            "--set",
            f"inference.output={tmp}/{name}/predictions",
            "--set",
            f"mlflow.registered_model=soak-{name}",
            "--set",
            "services.mlflow_wait_s=600",
            "--set",
            "services.prefect_wait_s=600",
            "--summary-json",
            f"{tmp}/{name}/summary.json",
        ],
        cwd=REPO,
        env=env,
        stdout=(tmp / f"{name}.log").open("w"),
        stderr=subprocess.STDOUT,
    )


def _training(tmp: Path, name: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    """Until the run's first checkpoint exists: training has begun."""
    deadline = time.monotonic() + timeout
    while not any((tmp / name / "runs").glob("**/checkpoint_*")):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name}: training never began:\n{(tmp / f'{name}.log').read_text()[-3000:]}")
        time.sleep(1)


def _finished(tmp: Path, name: str, proc: subprocess.Popen) -> dict:
    code = proc.wait(timeout=3600)
    log = (tmp / f"{name}.log").read_text()
    if code != 0:
        raise RuntimeError(f"{name}: exit {code}:\n{log[-4000:]}")
    return json.loads((tmp / name / "summary.json").read_text())


def main() -> None:
    from bench.common import report
    from tests.conftest import free_port
    from tests.servers import mlflow_server, prefect_env, prefect_server, stop

    outage = float(os.environ.get("TRAINFLOW_OUTAGE_S", "180"))
    if not (SAMPLE / "train.parquet").exists():
        subprocess.run(
            [sys.executable, "-m", "trainflow.flows.cli", "sample", "--out", str(SAMPLE)], check=True, cwd=REPO
        )
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        (tmp / "prefect").mkdir()
        mlflow_port, prefect_port = free_port(), free_port()
        servers = {
            "mlflow": mlflow_server(tmp / "mlflow", mlflow_port),
            "prefect": prefect_server(tmp / "prefect", prefect_port),
        }
        env = {
            **prefect_env(tmp / "prefect"),
            "PREFECT_API_URL": f"http://127.0.0.1:{prefect_port}/api",
            "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mlflow_port}",
        }
        restart = {
            "mlflow": lambda: mlflow_server(tmp / "mlflow", mlflow_port),
            "prefect": lambda: prefect_server(tmp / "prefect", prefect_port),
        }
        try:
            t0 = time.perf_counter()
            _finished(tmp, "baseline", _retrain(tmp, "baseline", env))
            base = time.perf_counter() - t0
            for service in os.environ.get("TRAINFLOW_OUTAGE_SERVICES", "mlflow,prefect").split(","):
                t0 = time.perf_counter()
                proc = _retrain(tmp, service, env)
                _training(tmp, service, proc)
                stop(servers[service])
                time.sleep(outage)
                servers[service] = restart[service]()
                summary = _finished(tmp, service, proc)
                ours = time.perf_counter() - t0
                log = (tmp / f"{service}.log").read_text()
                waited = "said what it waited for" if "waiting for the" in log else "no waiting line"
                report(
                    f"outage-soak-{service}",
                    ours,
                    base,
                    "s",
                    ours / base,
                    f"the demo's retrain (mlp + xgboost) with the {service} server stopped for {outage:.0f} s once "
                    f"training began vs with it up; exit 0, model version {summary.get('model_version')}, "
                    f"{waited}; ratio = time with the outage / without",
                )
        finally:
            for proc in servers.values():
                stop(proc)


if __name__ == "__main__":
    main()
