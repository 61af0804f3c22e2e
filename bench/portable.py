"""portable: the registered model and the package, installed where trainflow is not.

- portable-model: a model is trained (the bundled sample, 3,000 rows, the network for 2 epochs); a fresh venv on this
  Python gets only the model's own requirements.txt (from the package index pip is configured with), loads it with
  `mlflow.pyfunc.load_model` and predicts the scoring rows; the predictions must equal those trainflow's own venv
  gives (the bench fails otherwise). trainflow: the fresh venv's install, load and predict; baseline: load and predict
  in trainflow's venv.
- portable-package: `python -m build --wheel` of this checkout; a fresh venv installs the wheel (and its
  dependencies), then runs `trainflow --version`, `trainflow sample` and `trainflow validate` of a config
  `trainflow init` writes (the bench fails on any error). trainflow: build, install and those commands; baseline:
  the same commands in trainflow's venv.

Minutes each: the installs unpack torch and its neighbours. Not part of `make test`.
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

REPO = Path(__file__).resolve().parents[1]

PREDICT = textwrap.dedent("""
    import sys
    import mlflow
    import pyarrow.parquet as pq

    model_dir, score, out = sys.argv[1:]
    frame = pq.read_table(score).to_pandas()
    mlflow.pyfunc.load_model(model_dir).predict(frame.drop(columns=["customer_id"])).to_parquet(out)
""")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    return {**env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _run(args: list[str], cwd: Path, timeout: float = 1800) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"portable: {' '.join(map(str, args[:4]))} failed ({proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    return time.perf_counter() - t0


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin"


def _trained_model(work: Path) -> tuple[Path, Path]:
    """(the registered model's MLflow folder, the scoring table) of a small retrain in work."""
    trainflow = [sys.executable, "-m", "trainflow.flows.cli"]
    _run([*trainflow, "sample", "--out", "data", "--rows", "3000", "--score-rows", "1000"], work)
    cfg = work / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "data": {"path": "data/train.parquet", "label": "churned", "id_column": "customer_id"},
                "task": "classification",
                "model": {"type": "mlp", "params": {"mlp": {"epochs": 2}}},
                "storage_path": "runs",
                "mlflow": {"experiment": "portable", "registered_model": "portable"},
            }
        )
    )
    _run([*trainflow, "retrain", "--config", cfg, "--summary-json", work / "trained.json"], work)
    import mlflow

    summary = json.loads((work / "trained.json").read_text())
    uri = f"sqlite:///{work / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)  # models:/ URIs resolve through the registry
    model_dir = mlflow.artifacts.download_artifacts(summary["model_uri"], dst_path=str(work / "model"))
    return Path(model_dir), work / "data" / "score.parquet"


def portable_model(work: Path) -> None:
    import pandas as pd

    model_dir, score = _trained_model(work)
    baseline = _run([sys.executable, "-c", PREDICT, model_dir, score, work / "here.parquet"], work)
    t0 = time.perf_counter()
    bin_dir = _venv(work / "plain")
    _run([bin_dir / "pip", "install", "--quiet", "-r", model_dir / "requirements.txt"], work)
    _run([bin_dir / "python", "-c", PREDICT, model_dir, score, work / "plain.parquet"], work)
    wall = time.perf_counter() - t0
    found = subprocess.run([bin_dir / "python", "-c", "import trainflow"], capture_output=True, cwd=work)
    assert found.returncode != 0, "the plain venv can import trainflow: the check proves nothing"
    here, plain = pd.read_parquet(work / "here.parquet"), pd.read_parquet(work / "plain.parquet")
    pd.testing.assert_frame_equal(here, plain)
    requirements = (model_dir / "requirements.txt").read_text().split()
    print(
        f"portable-model: trainflow {wall:.1f} s, baseline {baseline:.1f} s, ratio {wall / baseline:.2f}  (a fresh "
        f"venv without trainflow: the model's requirements {requirements} installed, loaded with "
        f"mlflow.pyfunc.load_model, {len(plain):,} rows predicted, equal to trainflow's venv's; baseline: load and "
        f"predict in trainflow's venv)",
        flush=True,
    )


def portable_package(work: Path) -> None:
    steps = [
        ["--version"],
        ["sample", "--out", "data", "--rows", "2000"],
        ["init", "--data", "data/train.parquet", "--label", "churned", "--out", "trainflow.yaml"],
        ["validate", "--config", "trainflow.yaml"],
    ]
    here = work / "here"
    here.mkdir()
    bin_here = Path(sys.executable).parent
    baseline = sum(_run([bin_here / "trainflow", *s], here) for s in steps)
    t0 = time.perf_counter()
    builder = _venv(work / "builder")
    _run([builder / "pip", "install", "--quiet", "build"], work)
    _run([builder / "python", "-m", "build", "--wheel", "--outdir", work / "dist", REPO], work)
    [wheel] = list((work / "dist").glob("trainflow-*.whl"))
    bin_dir = _venv(work / "installed")
    _run([bin_dir / "pip", "install", "--quiet", wheel], work)
    fresh = work / "fresh"
    fresh.mkdir()
    for s in steps:
        _run([bin_dir / "trainflow", *s], fresh)
    wall = time.perf_counter() - t0
    version = subprocess.run([bin_dir / "trainflow", "--version"], capture_output=True, text=True).stdout.strip()
    print(
        f"portable-package: trainflow {wall:.1f} s, baseline {baseline:.1f} s, ratio {wall / baseline:.2f}  "
        f"({wheel.name} built with `python -m build`, installed into a fresh venv with its dependencies, then "
        f"`trainflow --version` ({version}), sample, init and validate there; baseline: those commands in "
        f"trainflow's venv)",
        flush=True,
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "model").mkdir()
        portable_model(Path(tmp) / "model")
    with tempfile.TemporaryDirectory() as tmp:
        portable_package(Path(tmp))


if __name__ == "__main__":
    main()
