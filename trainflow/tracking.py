"""MLflow helpers: tracking setup, signatures and parameter flattening."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema

from preprocessors.tabular import TabularPreprocessor

MODEL_CODE = str(Path(__file__).with_name("mlflow_model.py"))
CHAMPION = "champion"


def setup_tracking(tracking_uri: str, experiment: str) -> str:
    """Point MLflow at tracking_uri and return the experiment id, creating it next to a SQLite DB."""
    mlflow.set_tracking_uri(tracking_uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    artifact_location = None
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        artifact_location = (db.parent / "mlartifacts").resolve().as_uri()
    return mlflow.create_experiment(experiment, artifact_location=artifact_location)


def signature_for(prep: TabularPreprocessor) -> ModelSignature:
    """Input: the feature columns (double or string); output: prediction and class probabilities."""
    inputs = [ColSpec("double" if c in prep.numeric else "string", c) for c in prep.feature_order]
    if prep.task == "classification":
        kind = "string" if any(isinstance(c, str) for c in prep.classes) else "long"
        if any(isinstance(c, float) for c in prep.classes):
            kind = "double"
        outputs = [ColSpec(kind, "prediction")] + [ColSpec("double", f"proba_{c}") for c in prep.classes]
    else:
        outputs = [ColSpec("double", "prediction")]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'epochs': 3}} -> {'train.epochs': 3}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
