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

from trainflow.errors import UnreadableCheckpoint
from trainflow.run.storage import replace_bytes

CALIBRATION_FILE = "calibration.json"
# the ranges fitting produces (and clamps to): a stored value outside them was not written by a fit
TEMPERATURE_RANGE = (0.05, 20.0)
PLATT_SLOPE_RANGE = (1e-3, 100.0)  # positive: the scores keep their order (ROC AUC as trained)
PLATT_INTERCEPT_MAX = 100.0


def log_probs(outputs: np.ndarray) -> np.ndarray:
    return torch.log_softmax(torch.from_numpy(np.asarray(outputs, dtype=np.float32)), dim=1).numpy()


def fit_temperature(outputs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The temperature T > 0 that minimises the validation log-loss of softmax(outputs / T): SciPy's bounded scalar
    minimiser on log T over TEMPERATURE_RANGE (the loss is convex in 1/T). (torch's L-BFGS did the same; a process's
    first torch optimizer imports TorchDynamo, 1.5 s of CPU in every retrain's process.)"""
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax

    lp = log_probs(outputs).astype(np.float64)
    rows, target = np.arange(len(lp)), np.asarray(y, dtype=np.int64)

    def loss(log_t: float) -> float:
        return float(-log_softmax(lp / math.exp(log_t), axis=1)[rows, target].mean())

    bounds = (math.log(TEMPERATURE_RANGE[0]), math.log(TEMPERATURE_RANGE[1]))
    best = minimize_scalar(loss, bounds=bounds, method="bounded", options={"xatol": 1e-6})
    return {"method": "temperature", "temperature": float(np.clip(math.exp(best.x), *TEMPERATURE_RANGE))}


def fit_platt(outputs: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Binary: sigmoid(a * z + b) on the log-odds z = log p1 - log p0 (scikit-learn, almost unregularised)."""
    from sklearn.linear_model import LogisticRegression

    lp = log_probs(outputs)
    z = (lp[:, 1] - lp[:, 0]).reshape(-1, 1)
    fit = LogisticRegression(C=1e6).fit(z, np.asarray(y, dtype=np.int64))
    # a slope at or below 0 (a model no better than chance on these rows) would invert or flatten the ranking
    slope = float(np.clip(fit.coef_[0, 0], *PLATT_SLOPE_RANGE))
    intercept = float(np.clip(fit.intercept_[0], -PLATT_INTERCEPT_MAX, PLATT_INTERCEPT_MAX))
    return {"method": "platt", "slope": slope, "intercept": intercept}


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
        raise UnreadableCheckpoint(
            f"{path}: not a calibration trainflow wrote ({str(data)[:200]}); a fit stores temperature "
            f"T in {list(TEMPERATURE_RANGE)} or platt with slope in {list(PLATT_SLOPE_RANGE)} and "
            f"|intercept| <= {PLATT_INTERCEPT_MAX:g}, as numbers, and a threshold in (0, 1)"
        )
    return data


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _valid(data: Any) -> bool:
    """A method trainflow fits, with numbers (not text) inside the ranges its fits produce, and a threshold
    strictly between 0 and 1."""
    if not isinstance(data, dict):
        return False
    method, threshold = data.get("method"), data.get("threshold")
    if method == "temperature":
        t = data.get("temperature")
        ok = _number(t) and TEMPERATURE_RANGE[0] <= t <= TEMPERATURE_RANGE[1]
    elif method == "platt":
        a, b = data.get("slope"), data.get("intercept")
        ok = (
            _number(a)
            and PLATT_SLOPE_RANGE[0] <= a <= PLATT_SLOPE_RANGE[1]
            and _number(b)
            and abs(b) <= PLATT_INTERCEPT_MAX
        )
    else:
        ok = method is None
    return ok and (threshold is None or (_number(threshold) and 0.0 < threshold < 1.0))


def write_calibration(directory: str | Path, calibration: dict[str, Any] | None) -> None:
    """Store the calibration in the checkpoint folder (written whole, then moved over the old one); None removes an old
    one."""
    path = Path(directory) / CALIBRATION_FILE
    if calibration is None:
        path.unlink(missing_ok=True)
        return
    replace_bytes(str(path), json.dumps(calibration).encode())
