"""monitor-estimate: how close `trainflow monitor` without labels (CBPE: the expected accuracy and ROC AUC from the
served model's calibrated probabilities) comes to the accuracy and AUC its labels later give, under covariate shift
and under concept drift, on synthetic data whose true P(y | x) is known.

One retrain on 6,000 rows (x ~ N(0, I) in 6 dimensions, P(y=1 | x) = sigmoid(w.x)); then, for each scoring table of
5,000 rows, `trainflow predict`, `trainflow monitor` without labels (estimated) and with them (realised), as a user
runs them. Scoring tables: the training distribution; covariate shift away from the boundary (x + 1.0 w/|w|: easier,
accuracy rises) and towards it (x scaled by 0.4: harder, accuracy falls), where P(y | x) is unchanged and the
estimate should hold (target: within 0.02 of the realised accuracy); and concept drift (labels from -w.x on one
feature), where P(y | x) changes and no estimate from the probabilities alone can see it: the bench shows it break.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

DIM, TRAIN_ROWS, SCORE_ROWS = 6, 6000, 5000
W = np.array([1.2, -0.8, 0.6, 0.0, 0.4, -0.3])


def _table(x: np.ndarray, y: np.ndarray | None, start: int) -> pa.Table:
    cols = {"row_id": np.arange(start, start + len(x))}
    cols.update({f"x{i}": x[:, i] for i in range(DIM)})
    if y is not None:
        cols["y"] = y
    return pa.table(cols)


def _labels(x: np.ndarray, w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return (rng.random(len(x)) < 1 / (1 + np.exp(-(x @ w)))).astype(np.int64)


def _trainflow(*args: str) -> None:
    subprocess.run([str(Path(sys.executable).parent / "trainflow"), *args], check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    from bench.common import report

    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        x = rng.normal(size=(TRAIN_ROWS, DIM))
        pq.write_table(_table(x, _labels(x, W, rng), 0), tmp / "train.parquet")
        config = {
            "data": {"path": str(tmp / "train.parquet"), "label": "y", "id_column": "row_id"},
            "task": "classification",
            "storage_path": str(tmp / "runs"),
            "mlflow": {"tracking_uri": f"sqlite:///{tmp / 'mlflow.db'}", "registered_model": "estimate"},
            "monitor": {"min_rows": 100},
        }
        (tmp / "config.yaml").write_text(yaml.safe_dump(config))
        _trainflow("retrain", "--config", str(tmp / "config.yaml"), "--set", "model.type=[mlp, xgboost]")
        flipped = W.copy()
        flipped[0] = -flipped[0]  # the first feature's effect reversed: P(y | x) changed
        unit = W / np.linalg.norm(W)
        cases = {
            "same": (lambda z: z, W),
            "covariate-away": (lambda z: z + 1.0 * unit, W),
            "covariate-toward": (lambda z: 0.4 * z, W),
            "concept-drift": (lambda z: z, flipped),
        }
        for i, (case, (shift, w)) in enumerate(cases.items()):
            xs = shift(rng.normal(size=(SCORE_ROWS, DIM)))
            ys = _labels(xs, w, rng)
            start = 1_000_000 * (i + 1)
            pq.write_table(_table(xs, None, start), tmp / f"{case}.parquet")
            pq.write_table(_table(xs, ys, start).select(["row_id", "y"]), tmp / f"{case}-labels.parquet")
            io = ["--set", f"inference.input={tmp / f'{case}.parquet'}", "--set", f"inference.output={tmp / case}"]
            _trainflow("predict", "--config", str(tmp / "config.yaml"), *io)
            figures = {}
            for kind, labels in (("estimated", []), ("realised", ["--labels", str(tmp / f"{case}-labels.parquet")])):
                out = tmp / f"{case}-{kind}.json"
                _trainflow("monitor", "--config", str(tmp / "config.yaml"), *io, *labels, "--summary-json", str(out))
                figures[kind] = json.loads(out.read_text())["monitor"]["metrics"]
            est, real = figures["estimated"], figures["realised"]
            error = est["val_accuracy"] - real["val_accuracy"]
            # the accuracy these predictions have in expectation under the true P(y | x), free of the labels' draw:
            # estimate - expected is the estimate's own bias, realised - expected the sampling noise
            preds = pq.read_table(tmp / case, columns=["row_id", "prediction"]).sort_by("row_id")
            p_true = 1 / (1 + np.exp(-(xs @ w)))
            hit = np.where(preds["prediction"].to_numpy() == 1, p_true, 1 - p_true)
            expected, se = float(hit.mean()), float(np.sqrt(np.sum(hit * (1 - hit))) / len(hit))
            target = "target |error| <= 0.02" if case != "concept-drift" else "P(y|x) changed: no target, it breaks"
            report(
                f"monitor-estimate-{case}",
                est["val_accuracy"],
                real["val_accuracy"],
                "accuracy",
                est["val_accuracy"] / real["val_accuracy"],
                f"{SCORE_ROWS} scoring rows: accuracy estimated without labels vs realised with them, error "
                f"{error:+.3f}; expected under the true P(y|x) {expected:.4f} (the labels' draw: SE {se:.4f}), "
                f"estimate - expected {est['val_accuracy'] - expected:+.3f}; ROC AUC {est.get('val_roc_auc', float('nan')):.3f} vs "
                f"{real.get('val_roc_auc', float('nan')):.3f}; {target}",
                digits=3,
            )


if __name__ == "__main__":
    main()
