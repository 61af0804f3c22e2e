"""demo-e2e: seconds for `make demo`'s retrain on the bundled sample, vs a plain single-process script.

trainflow: `trainflow retrain --config configs/demo.yaml --set model.type=mlp` as a fresh process (imports, Prefect's
temporary server, local Ray, 2 Train workers, MLflow, the champion gate, inference). Baseline: one
Python process that reads the same tables with pyarrow, standardizes and one-hot encodes with
numpy, trains the same MLP for the same epochs with torch, and writes the predictions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"

BASELINE = r"""
import sys, numpy as np, pyarrow.parquet as pq, pyarrow as pa, torch, yaml
from trainflow.trainer.families.network import build_model
torch.manual_seed(0)
cfg = yaml.safe_load(open(sys.argv[1]))
train, score = pq.read_table(sys.argv[2]), pq.read_table(sys.argv[3])
label, idc = cfg["data"]["label"], cfg["data"]["id_column"]
feats = [c for c in train.column_names if c not in (label, idc)]
def pack(t, stats):
    cols = []
    for c in feats:
        a = t[c]
        if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
            v = np.asarray(a.fill_null("").to_pylist(), dtype=object)
            cols += [(v == k).astype(np.float32)[:, None] for k in stats[c]]
        else:
            x = a.to_numpy(zero_copy_only=False).astype(np.float32)
            m, s = stats[c]
            cols.append(((np.where(np.isnan(x), m, x) - m) / s)[:, None])
    return np.hstack(cols)
stats = {}
for c in feats:
    a = train[c]
    if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
        stats[c] = sorted(set(a.fill_null("").to_pylist()))
    else:
        x = a.to_numpy(zero_copy_only=False).astype(np.float32)
        stats[c] = (np.nanmean(x), np.nanstd(x) or 1.0)
x, y = torch.from_numpy(pack(train, stats)), torch.from_numpy(train[label].to_numpy().astype(np.int64))
model = build_model(x.shape[1], 2, cfg["model"])  # its layers as trainflow builds them, without its embeddings
opt = torch.optim.Adam(model.parameters(), lr=cfg["model"]["learning_rate"])
bs = cfg["model"]["batch_size"]
for _ in range(cfg["model"]["epochs"]):
    perm = torch.randperm(len(y))
    for i in range(0, len(y), bs):
        j = perm[i:i + bs]
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x[j]), y[j]).backward(); opt.step()
with torch.inference_mode():
    p = torch.softmax(model(torch.from_numpy(pack(score, stats))), 1).numpy()
pq.write_table(pa.table({idc: score[idc], "prediction": p.argmax(1), "proba_1": p[:, 1]}), sys.argv[4])
"""


def main() -> None:
    if not (SAMPLE / "train.parquet").exists():
        subprocess.run(
            [sys.executable, "-m", "trainflow.flows.cli", "sample", "--out", str(SAMPLE)], check=True, cwd=REPO
        )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "trainflow.flows.cli",
                "retrain",
                "--config",
                str(REPO / "configs" / "demo.yaml"),
                # the network alone, as the baseline trains it (the demo's default, auto, also trains two boosters)
                "--set",
                "model.type=mlp",
                "--set",
                f"storage_path={tmp}/runs",
                "--set",
                f"inference.output={tmp}/predictions",
                "--set",
                f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db",
                "--summary-json",
                f"{tmp}/summary.json",
            ],
            check=True,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )
        ours = time.perf_counter() - t0
        # the baseline trains the same network for the epochs trainflow ran, at its global batch size
        summary = json.loads(Path(f"{tmp}/summary.json").read_text())
        resolved = json.loads((Path(summary["best_checkpoint"]["path"]) / "config.json").read_text())
        resolved["model"]["epochs"] = summary["epochs_run"]  # (the network's keys: in its checkpoint's model section)
        resolved["model"]["batch_size"] = summary["training_budget"]["batch_size"] * resolved["scaling"]["num_workers"]
        Path(f"{tmp}/baseline.yaml").write_text(yaml.safe_dump(resolved))
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-c",
                BASELINE,
                f"{tmp}/baseline.yaml",
                str(SAMPLE / "train.parquet"),
                str(SAMPLE / "score.parquet"),
                f"{tmp}/baseline.parquet",
            ],
            check=True,
            cwd=REPO,
        )
        base = time.perf_counter() - t0
    from bench.common import report

    report(
        "demo-e2e",
        ours,
        base,
        "s",
        ours / base,
        "make demo's retrain as a fresh process vs one plain pyarrow+numpy+torch process, same data and epochs; target trainflow <= 40 s",
    )


if __name__ == "__main__":
    main()
