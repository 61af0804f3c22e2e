"""Validation metrics from raw model outputs, the same for every model family (scikit-learn)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainflow.preprocessors.tabular import TabularPreprocessor


def compute_metrics(task: str, out: np.ndarray, y: np.ndarray, prep: TabularPreprocessor) -> dict[str, float]:
    """Validation metrics from raw model outputs and encoded labels (sklearn)."""
    from sklearn import metrics as skm  # here: a run that trains nothing (a skipped retrain) never imports sklearn

    if len(y) == 0:
        return {"val_loss": float("nan")}
    if task == "classification":
        # log-softmax in NumPy (as torch's cross entropy, in float64): a booster's worker never imports torch
        z = np.asarray(out, dtype=np.float64)
        z = z - z.max(axis=1, keepdims=True)
        log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        probs = np.exp(log_probs)
        pred = probs.argmax(axis=1)
        labels = list(range(prep.num_outputs))
        m = {
            "val_loss": float(-log_probs[np.arange(len(y)), y.astype(np.int64)].mean()),
            "val_accuracy": float(skm.accuracy_score(y, pred)),
            "val_f1": float(
                skm.f1_score(y, pred, average="binary" if len(labels) == 2 else "macro", labels=labels, zero_division=0)
            ),
        }
        if len(labels) == 2 and len(np.unique(y)) == 2:
            m["val_roc_auc"] = float(skm.roc_auc_score(y, probs[:, 1]))
        return m
    pred_std = out.reshape(-1)
    m = {"val_loss": float(np.mean((pred_std - y) ** 2))}
    pred = pred_std * prep.label_std + prep.label_mean
    truth = y * prep.label_std + prep.label_mean
    m["val_rmse"] = float(math.sqrt(skm.mean_squared_error(truth, pred)))
    m["val_mae"] = float(skm.mean_absolute_error(truth, pred))
    m["val_r2"] = float(skm.r2_score(truth, pred)) if len(truth) > 1 else float("nan")
    return m


def calibration(out: np.ndarray, y: np.ndarray, num_classes: int, bins: int = 15) -> dict[str, Any]:
    """Top-label expected calibration error (torchmetrics, equal-width bins), the Brier score (scikit-learn's: the
    positive class's for two classes, summed over classes for more), and the reliability
    curve: per bin of confidence, its rows, mean confidence and accuracy."""
    import torch
    from sklearn.metrics import brier_score_loss
    from torchmetrics.functional.classification import multiclass_calibration_error

    probs = torch.softmax(
        torch.from_numpy(np.asarray(out, dtype=np.float64)), dim=1
    )  # float64: rows sum to 1 for sklearn
    target = torch.from_numpy(np.asarray(y, dtype=np.int64))
    ece = float(multiclass_calibration_error(probs, target, num_classes=num_classes, n_bins=bins, norm="l1"))
    p = probs.numpy().astype(np.float64)
    brier = float(
        brier_score_loss(y.astype(np.int64), p if num_classes > 2 else p[:, 1], labels=list(range(num_classes)))
    )
    confidence, predicted = p.max(axis=1), p.argmax(axis=1)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1], right=True), 0, bins - 1)
    curve = []
    for b in range(bins):
        rows = which == b
        if rows.any():
            curve.append(
                {
                    "low": float(edges[b]),
                    "high": float(edges[b + 1]),
                    "rows": int(rows.sum()),
                    "confidence": float(confidence[rows].mean()),
                    "accuracy": float((predicted[rows] == y[rows]).mean()),
                }
            )
    return {"ece": ece, "brier": brier, "bins": curve}
