"""Calibration as stored data: the fits recover a known distortion, and a calibration.json that trainflow did not
write is refused when the checkpoint loads."""

import json

import numpy as np
import pytest

from trainflow.trainer.serving.calibration import (
    CALIBRATION_FILE,
    apply,
    fit_platt,
    fit_temperature,
    log_probs,
    read_calibration,
    write_calibration,
)
from trainflow.trainer.metrics import calibration


def _overconfident(rows=20000, classes=3, temperature=3.0, seed=0):
    """Labels drawn from softmax(z); the model reports z * temperature (over-confident by that factor)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(rows, classes)) * 1.5
    p = np.exp(log_probs(z))
    y = np.array([rng.choice(classes, p=row) for row in p])
    return (z * temperature).astype(np.float32), y


def test_temperature_undoes_an_overconfident_model_and_keeps_every_argmax():
    out, y = _overconfident()
    fitted = fit_temperature(out, y)
    assert fitted["temperature"] == pytest.approx(3.0, rel=0.1)
    before, after = calibration(out, y, 3)["ece"], calibration(apply(fitted, out), y, 3)["ece"]
    assert before > 0.08 and after < 0.02
    assert np.array_equal(apply(fitted, out).argmax(axis=1), out.argmax(axis=1))


def test_platt_fixes_a_shifted_binary_model_and_keeps_the_ranking():
    rng = np.random.default_rng(1)
    z = rng.normal(size=20000) * 2
    y = (rng.random(20000) < 1 / (1 + np.exp(-z))).astype(int)
    out = np.stack([np.zeros_like(z), 0.5 * z + 1.0], axis=1).astype(np.float32)  # under-confident, shifted
    fitted = fit_platt(out, y)
    assert fitted["slope"] == pytest.approx(2.0, rel=0.1) and fitted["intercept"] == pytest.approx(-2.0, rel=0.15)
    assert calibration(apply(fitted, out), y, 2)["ece"] < 0.02 < calibration(out, y, 2)["ece"]
    p1 = np.exp(apply(fitted, out)[:, 1])
    assert np.all(np.diff(p1[np.argsort(out[:, 1])]) >= 0)  # the same ranking (ROC AUC unchanged)


@pytest.mark.parametrize(
    "planted",
    [
        {"method": "pickle", "payload": "x"},
        {"method": "temperature", "temperature": -1},
        {"method": "platt", "slope": "nan", "intercept": 0},
        {"threshold": 1.5},
        ["not", "a", "dict"],
    ],
)
def test_a_calibration_trainflow_did_not_write_is_refused(tmp_path, planted):
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps(planted))
    with pytest.raises(ValueError, match="not a calibration trainflow wrote"):
        read_calibration(tmp_path)
    write_calibration(tmp_path, {"method": "temperature", "temperature": 1.5, "threshold": 0.3})
    assert read_calibration(tmp_path) == {"method": "temperature", "temperature": 1.5, "threshold": 0.3}
    write_calibration(tmp_path, None)
    assert read_calibration(tmp_path) is None and not list(tmp_path.iterdir())
