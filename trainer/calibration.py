"""Probability calibration fitted on the validation split, stored as data (calibration.json) in the checkpoint and
applied by load_servable, so every prediction (batch inference, the gate, MLflow's pyfunc, monitoring) uses it.

Temperature scaling (Guo et al., 2017) divides the logits by one fitted number; Platt scaling (binary) fits a slope and
an intercept on the log-odds with scikit-learn's LogisticRegression. Neither changes which class ranks first (a
temperature), nor the order of the scores (Platt with a positive slope), so accuracy and ROC AUC stay as trained.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

CALIBRATION_FILE = "calibration.json"


def log_probs(outputs: np.ndarray) -> np.ndarray:
    return torch.log_softmax(torch.from_numpy(np.asarray(outputs, dtype=np.float32)), dim=1).numpy()


def fit_temperature(outputs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The temperature T > 0 that minimises the validation log-loss of softmax(outputs / T) (L-BFGS on log T)."""
    logits = torch.from_numpy(log_probs(outputs)).double()
    target = torch.from_numpy(np.asarray(y, dtype=np.int64))
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / log_t.exp(), target)
        loss.backward()
        return loss

    opt.step(closure)
    return {"method": "temperature", "temperature": float(log_t.detach().exp().clamp(0.05, 20.0))}


def fit_platt(outputs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Binary: sigmoid(a * z + b) on the log-odds z = log p1 - log p0 (scikit-learn, almost unregularised)."""
    from sklearn.linear_model import LogisticRegression

    lp = log_probs(outputs)
    z = (lp[:, 1] - lp[:, 0]).reshape(-1, 1)
    fit = LogisticRegression(C=1e6).fit(z, np.asarray(y, dtype=np.int64))
    return {"method": "platt", "slope": float(fit.coef_[0, 0]), "intercept": float(fit.intercept_[0])}


def apply(calibration: dict[str, Any] | None, outputs: np.ndarray) -> np.ndarray:
    """Calibrated log-probabilities for a classifier's outputs (unchanged when calibration is None)."""
    if not calibration or not calibration.get("method"):
        return outputs
    lp = log_probs(outputs)
    if calibration["method"] == "temperature":
        return log_probs(lp / calibration["temperature"])
    if calibration["method"] == "platt":
        z = calibration["slope"] * (lp[:, 1] - lp[:, 0]) + calibration["intercept"]
        p1 = torch.from_numpy(z.astype(np.float32))
        return torch.stack([torch.nn.functional.logsigmoid(-p1), torch.nn.functional.logsigmoid(p1)], dim=1).numpy()
    raise ValueError(f"{CALIBRATION_FILE}: unknown method {calibration['method']!r} (temperature or platt)")


def read_calibration(directory: str | Path) -> dict[str, Any] | None:
    """The checkpoint's calibration, checked; None when it has none."""
    path = Path(directory) / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        data = None
    if not _valid(data):
        raise ValueError(f"{path}: not a calibration trainflow wrote ({str(data)[:200]})")
    return data


def _valid(data: Any) -> bool:
    """A method trainflow fits with finite, plausible numbers (or none), and a threshold strictly between 0 and 1."""
    try:
        method = data.get("method")
        if method == "temperature":
            ok = 0.0 < float(data["temperature"]) < 100.0
        elif method == "platt":
            ok = math.isfinite(float(data["slope"])) and math.isfinite(float(data["intercept"]))
        else:
            ok = method is None
        threshold = data.get("threshold")
        return ok and (threshold is None or 0.0 < float(threshold) < 1.0)
    except (AttributeError, KeyError, TypeError, ValueError):
        return False


def write_calibration(directory: str | Path, calibration: dict[str, Any] | None) -> None:
    """Store the calibration in the checkpoint folder (written whole, then renamed); None removes an old one."""
    path = Path(directory) / CALIBRATION_FILE
    if calibration is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(calibration))
    tmp.replace(path)
