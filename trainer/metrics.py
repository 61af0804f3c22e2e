"""Validation metrics from raw model outputs, the same for every model family (scikit-learn)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from trainflow.preprocessors.tabular import TabularPreprocessor


def compute_metrics(task: str, out: np.ndarray, y: np.ndarray, prep: TabularPreprocessor) -> dict[str, float]:
    """Validation metrics from raw model outputs and encoded labels (sklearn)."""
    from sklearn import metrics as skm  # here: a run that trains nothing (a skipped retrain) never imports sklearn

    if len(y) == 0:
        return {"val_loss": float("nan")}
    if task == "classification":
        logits = torch.from_numpy(out)
        target = torch.from_numpy(y.astype(np.int64))
        probs = torch.softmax(logits, dim=1).numpy()
        pred = probs.argmax(axis=1)
        labels = list(range(prep.num_outputs))
        m = {
            "val_loss": float(nn.functional.cross_entropy(logits, target)),
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
