"""Task: calibrate the selected classifier's probabilities on the validation split when the pipeline distorted them
(class weights, or a validation ECE above calibration.max_ece), before the checkpoint is registered."""

from __future__ import annotations

from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.data import Rows
from trainflow.config import Config
from trainflow.run.storage import is_uri
from trainflow.tasks.values import Selected
from trainflow.trainer.serving.calibration import apply, fit_platt, fit_temperature, log_probs, write_calibration
from trainflow.trainer.evaluate import Scored, score_checkpoint
from trainflow.trainer.families import REGISTRY
from trainflow.trainer.metrics import calibration

FITS = {"temperature": fit_temperature, "platt": fit_platt}


@task(name="calibrate", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def calibrate(
    config: Config,
    holdout: Rows | None,
    selected: Selected,
    family: str,
    raw: Scored | None = None,
    on: str | None = None,
) -> tuple[dict[str, Any] | None, Scored | None]:
    """Fit, check and store (calibration.json in the checkpoint) or remove a calibration and a decision threshold;
    what was done and why, with the validation ECE and Brier score before and after, and the validation split's
    scored outputs as the checkpoint now serves them ((None, None) for regression). raw: the checkpoint's
    uncalibrated outputs on the rows to fit on when the caller has them (cross-fitting's out-of-fold outputs, where
    there is no validation split: holdout None); on: what raw's rows are, where not that (a refit's: its chosen
    model's validation outputs)."""
    if config.task != "classification":
        return None, None
    on = on or ("validation" if raw is None else "out-of-fold")
    if raw is None:
        raw = score_checkpoint(selected.path, holdout, tuple(config.promotion.slices), calibrated=False)
    fitted, record = _fit(config, raw, family, on)
    outputs = apply(fitted, raw.outputs)
    threshold = _threshold(config, outputs, raw.labels, raw.prep.num_outputs, record, on)
    record["fitted_on"] = f"{on} rows ({len(raw.labels)})"
    stored = {**(fitted or {}), **({"threshold": threshold} if threshold is not None else {})}
    write_calibration(selected.path, stored or None)  # the checked copy every later step serves
    if selected.uri and not is_uri(selected.uri) and selected.uri != selected.path:
        write_calibration(selected.uri, stored or None)  # and the run's own checkpoint, for `predict --model <folder>`
    get_run_logger().info(
        "calibration: %s", ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items())
    )
    # the checkpoint's outputs as it now serves them (calibration applied), on every validation row with the slice
    # columns: the gate judges these instead of reading the validation split again
    return record, Scored(raw.prep, outputs, raw.labels, raw.columns)


def _fit(config: Config, raw, family: str, on: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the calibration to store or None, what the summary records)."""
    method, n = config.calibration.method, raw.prep.num_outputs
    if method == "none":
        return None, {"method": None, "why": "calibration.method: none"}
    before = calibration(raw.outputs, raw.labels, n)
    record: dict[str, Any] = {"ece_before": before["ece"], "brier_before": before["brier"]}
    if method == "auto":
        if config.train.class_weight is None and before["ece"] <= config.calibration.max_ece:
            return None, {
                **record,
                "method": None,
                "why": f"{on} ECE {before['ece']:.4f} <= calibration.max_ece {config.calibration.max_ece:g}",
            }
        # two classes: the family's method (an ensemble of probabilities: Platt scaling); more: a temperature
        method = (REGISTRY[family].calibration if family in REGISTRY else "platt") if n == 2 else "temperature"
        why = (
            "train.class_weight is set"
            if config.train.class_weight is not None
            else f"{on} ECE {before['ece']:.4f} > calibration.max_ece {config.calibration.max_ece:g}"
        )
    else:
        why = f"calibration.method: {method}"
    if method == "platt" and n != 2:
        method, why = "temperature", why + " (Platt scaling is for two classes: a temperature instead)"
    fitted = FITS[method](raw.outputs, raw.labels)
    after = calibration(apply(fitted, raw.outputs), raw.labels, n)
    record.update(ece_after=after["ece"], brier_after=after["brier"])
    if config.calibration.method == "auto" and after["ece"] >= before["ece"]:
        return None, {**record, "method": None, "why": f"{why}; {method} did not lower the ECE"}
    return fitted, {**record, **fitted, "why": why}


def _threshold(
    config: Config, outputs: np.ndarray, y: np.ndarray, n: int, record: dict[str, Any], on: str = "validation"
) -> float | None:
    """calibration.decision_threshold for two classes: a number as given, or f1's (the positive class's probability
    that maximises F1 on the validation split, scikit-learn's precision_recall_curve); recorded in record."""
    asked = config.calibration.decision_threshold
    if asked == "none":
        return None
    if n != 2:
        record["threshold_why"] = "a decision threshold is for two classes: argmax kept"
        return None
    if asked != "f1":
        record.update(threshold=float(asked), threshold_why="calibration.decision_threshold")
        return float(asked)
    from sklearn.metrics import precision_recall_curve

    p1 = np.exp(log_probs(outputs)[:, 1])
    precision, recall, cuts = precision_recall_curve(y, p1)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    best = int(np.argmax(f1[:-1])) if len(cuts) else None
    if best is None:
        return None
    record.update(threshold=float(cuts[best]), threshold_why=f"maximises {on} F1 ({f1[best]:.4f})")
    return float(cuts[best])
