"""Task: calibrate the selected classifier's probabilities on the validation split when the pipeline distorted them
(class weights, or a validation ECE above calibration.max_ece), before the checkpoint is registered."""

from __future__ import annotations

from typing import Any

import ray.data
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.config import Config
from trainflow.tasks.select import Selected
from trainflow.trainer.calibration import apply, fit_platt, fit_temperature, write_calibration
from trainflow.trainer.evaluate import score_checkpoint
from trainflow.trainer.families import FAMILIES
from trainflow.trainer.metrics import calibration

FITS = {"temperature": fit_temperature, "platt": fit_platt}


@task(name="calibrate", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def calibrate(config: Config, holdout: ray.data.Dataset, selected: Selected, family: str) -> dict[str, Any] | None:
    """Fit, check and store (calibration.json in the checkpoint) or remove a calibration; what was done and why,
    with the validation ECE and Brier score before and after (None for regression)."""
    if config.task != "classification":
        return None
    log = get_run_logger()
    method = config.calibration.method
    if method == "none":
        write_calibration(selected.path, None)
        return {"method": None, "why": "calibration.method: none"}
    raw = score_checkpoint(selected.path, holdout, calibrated=False)
    n = raw.prep.num_outputs
    before = calibration(raw.outputs, raw.labels, n)
    record: dict[str, Any] = {"ece_before": before["ece"], "brier_before": before["brier"]}
    if method == "auto":
        if config.train.class_weight is None and before["ece"] <= config.calibration.max_ece:
            write_calibration(selected.path, None)
            log.info("calibration: none needed (validation ECE %.4f <= calibration.max_ece %g)", before["ece"],
                     config.calibration.max_ece)
            return {**record, "method": None, "why": f"validation ECE {before['ece']:.4f} <= calibration.max_ece "
                                                      f"{config.calibration.max_ece:g}"}
        method = FAMILIES[family].calibration if n == 2 else "temperature"
        why = "train.class_weight is set" if config.train.class_weight is not None else \
            f"validation ECE {before['ece']:.4f} > calibration.max_ece {config.calibration.max_ece:g}"
    else:
        why = f"calibration.method: {method}"
    if method == "platt" and n != 2:
        method, why = "temperature", why + " (Platt scaling is for two classes: a temperature instead)"
    fitted = FITS[method](raw.outputs, raw.labels)
    after = calibration(apply(fitted, raw.outputs), raw.labels, n)
    record.update(ece_after=after["ece"], brier_after=after["brier"])
    if config.calibration.method == "auto" and after["ece"] >= before["ece"]:
        write_calibration(selected.path, None)
        log.info("calibration: %s did not lower the validation ECE (%.4f -> %.4f): not kept", method, before["ece"], after["ece"])
        return {**record, "method": None, "why": f"{why}; {method} did not lower the ECE"}
    write_calibration(selected.path, fitted)
    log.info("calibration: %s (%s): validation ECE %.4f -> %.4f, Brier %.4f -> %.4f", method, why, before["ece"],
             after["ece"], before["brier"], after["brier"])
    return {**record, **fitted, "why": why}
