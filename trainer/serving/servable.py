"""Serving a checkpoint of any family: its predictor behind one call, with no Ray, Prefect or MLflow imported.

This folder (trainer/serving/), the families and the preprocessor are what the registered MLflow model ships as its
code (tasks/model_package.py, code_paths), so it serves where trainflow is not installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from trainflow.errors import UnreadableCheckpoint
from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.trainer.serving.calibration import apply as apply_calibration, read_calibration
from trainflow.trainer.serving.checkpoint import read_config, read_metrics
from trainflow.trainer.families import REGISTRY, checkpoint_family
from trainflow.trainer.families.base import EPS


@dataclass
class ServableModel:
    """A checkpoint loaded for prediction: predict maps packed features to model outputs (logits or
    log-probabilities per class, or the standardized value), whatever the family."""

    predict: Callable[[np.ndarray], np.ndarray]
    preprocessor: TabularPreprocessor
    config: dict[str, Any]
    epoch: int
    metrics: dict[str, float]
    threshold: float | None = None  # two classes: the positive class from this probability on (calibration.json)
    source: str = ""  # the checkpoint folder it was loaded from (named when its outputs are not finite)

    @property
    def family(self) -> str:
        return checkpoint_family(self.config)


ENSEMBLE = "ensemble"
ENSEMBLE_FILE = "ensemble.json"
MEMBERS_DIR = "members"


def combine(task: str, outputs: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Several models' outputs as one: the weighted mean of their class probabilities (as log-probabilities, the
    outputs' form) or of their standardized values."""
    if task == "regression":
        return sum(w * np.asarray(o, np.float64) for o, w in zip(outputs, weights)).astype(np.float32)
    probs = sum(
        w * torch.softmax(torch.from_numpy(np.asarray(o, np.float32)), dim=1).double().numpy()
        for o, w in zip(outputs, weights)
    )
    return np.log(np.clip(probs, EPS, 1.0)).astype(np.float32)


def read_ensemble(directory: str | Path) -> list[tuple[str, float]]:
    """(member family, weight) of an ensemble checkpoint, read strictly: each a family trainflow serves (no nested
    ensembles) at most once, whose folder is members/<family>; weights finite, positive and summing to 1."""
    path = Path(directory) / ENSEMBLE_FILE
    try:
        members = json.loads(path.read_text())["members"]
        pairs = [(m["family"], float(m["weight"])) for m in members]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableCheckpoint(f"{path}: not an ensemble trainflow wrote ({type(exc).__name__}: {exc})") from None
    families = [f for f, _ in pairs]
    bad = [f for f in families if f not in PREDICTORS or f == ENSEMBLE]
    weights = np.array([w for _, w in pairs])
    if (
        not pairs
        or bad
        or len(set(families)) != len(families)
        or not np.isfinite(weights).all()
        or (weights <= 0).any()
        or abs(weights.sum() - 1.0) > 1e-6
    ):
        raise UnreadableCheckpoint(
            f"{path}: members {pairs} are not distinct served families ({sorted(set(PREDICTORS) - {ENSEMBLE})}) "
            "with positive weights summing to 1"
        )
    return pairs


def member_dir(directory: str | Path, family: str) -> Path:
    """Where an ensemble checkpoint keeps a member family's checkpoint (never a path read from a file)."""
    return Path(directory) / MEMBERS_DIR / family


def member_dirs(directory: str | Path) -> list[Path]:
    """The checkpoint folders inside a checkpoint: an ensemble's members, and the fold models of a bagged one (or of
    a bagged member); none for a plain checkpoint."""
    members = []
    if read_config(directory)["model"].get("type") == ENSEMBLE:
        members = [member_dir(directory, family) for family, _ in read_ensemble(directory)]
    return members + [
        fold_dir(d, k) for d in [Path(directory), *members] if (d / BAG_FILE).exists() for k in range(read_bag(d))
    ]


BAG_FILE = "bag.json"
FOLDS_DIR = "folds"
MAX_FOLDS = 20


def fold_dir(directory: str | Path, fold: int) -> Path:
    """Where a bagged checkpoint keeps fold model `fold` (never a path read from a file)."""
    return Path(directory) / FOLDS_DIR / f"fold_{fold}"


def read_bag(directory: str | Path) -> int:
    """The number of fold models of a bagged checkpoint (bag.json), read strictly: an integer from 2 to MAX_FOLDS."""
    path = Path(directory) / BAG_FILE
    try:
        folds = json.loads(path.read_text())["folds"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableCheckpoint(
            f"{path}: not a bagged checkpoint trainflow wrote ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(folds, int) or isinstance(folds, bool) or not 2 <= folds <= MAX_FOLDS:
        raise UnreadableCheckpoint(f"{path}: folds {folds!r} is not a whole number from 2 to {MAX_FOLDS}")
    return folds


def check_member(sub: Path, prep: TabularPreprocessor, family: str) -> dict[str, Any]:
    """A checkpoint inside another (an ensemble member, a fold model): the same preprocessing and the family the
    outer one names; its config."""
    if TabularPreprocessor.load(sub).to_dict() != prep.to_dict():
        raise ValueError(f"{sub}: its preprocessor.json differs from the checkpoint's that holds it")
    member_config = read_config(sub)
    if checkpoint_family(member_config) != family:
        raise ValueError(f"{sub / 'config.json'}: model.type is not {family!r}, as the checkpoint that holds it says")
    return member_config


class BaggedPredictor:
    """A family's fold models (folds/fold_<k>, each as the family's predictor, uncalibrated) served as one: their
    probabilities (or values) averaged; calibration, when the checkpoint holds one, applies to the average."""

    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
        family = checkpoint_family(config)
        if family not in REGISTRY:
            raise ValueError(f"{Path(directory) / BAG_FILE}: a bag of {family!r} models is not one trainflow serves")
        self.task, self.members = prep.task, []
        for k in range(read_bag(directory)):
            sub = fold_dir(directory, k)
            self.members.append(REGISTRY[family].predictor(sub, prep, check_member(sub, prep, family), device))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return combine(self.task, [member(x) for member in self.members], [1.0 / len(self.members)] * len(self.members))

    def __getattr__(self, name: str) -> Any:
        if name == "native_importance" and all(hasattr(m, name) for m in self.__dict__.get("members", [])):
            return lambda: np.mean([m.native_importance() for m in self.members], axis=0)
        raise AttributeError(name)


def predictor_for(directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
    """The predictor of a checkpoint folder: its family's, or a bag of its fold models (bag.json)."""
    if (Path(directory) / BAG_FILE).exists():
        return BaggedPredictor(directory, prep, config, device)
    return PREDICTORS[checkpoint_family(config)](directory, prep, config, device)


class EnsemblePredictor:
    """Several families' checkpoints (members/<family>, each as its family's predictor or bag of fold models,
    uncalibrated) weighted into one model (ensemble.json); every member reads the ensemble's own preprocessing."""

    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
        self.task, self.members, self.weights = prep.task, [], []
        for family, weight in read_ensemble(directory):
            sub = member_dir(directory, family)
            self.members.append(predictor_for(sub, prep, check_member(sub, prep, family), device))
            self.weights.append(weight)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return combine(self.task, [member(x) for member in self.members], self.weights)


# each family's predictor, and the ensemble's, built from a checkpoint folder; its config.json names which
PREDICTORS: dict[str, Callable[..., Callable[[np.ndarray], np.ndarray]]] = {
    **{name: family.predictor for name, family in REGISTRY.items()},
    ENSEMBLE: EnsemblePredictor,
}


def checkpoint_families(directory: str | Path) -> list[str]:
    """The families whose code serves a checkpoint: its own, or an ensemble's members'."""
    family = checkpoint_family(read_config(directory))
    return [f for f, _ in read_ensemble(directory)] if family == ENSEMBLE else [family]


class CalibratedPredictor:
    """A classifier's predictor with the checkpoint's calibration applied to its outputs (trainer/serving/calibration.py);
    anything else is the family's predictor's."""

    def __init__(self, inner: Callable[[np.ndarray], np.ndarray], calibration: dict[str, Any]):
        self.inner, self.calibration = inner, calibration

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return apply_calibration(self.calibration, self.inner(x))

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def load_servable(directory: str | Path, device: str | torch.device = "cpu", calibrated: bool = True) -> ServableModel:
    """Load and verify a checkpoint of any family: every file parses and the model fits the preprocessor; its
    outputs calibrated when the checkpoint holds a calibration (calibrated=False: as trained)."""
    directory = Path(directory)
    prep = TabularPreprocessor.load(directory)
    config = read_config(directory)
    meta = read_metrics(directory)
    family = checkpoint_family(config)
    if family not in PREDICTORS:
        raise ValueError(
            f"{directory / 'config.json'}: model.type {family!r} is not a family this trainflow serves "
            f"({sorted(PREDICTORS)})"
        )
    predict = predictor_for(directory, prep, config, str(device))
    calibration = read_calibration(directory) if prep.task == "classification" else None
    if calibration and calibration.get("method") and calibrated:
        predict = CalibratedPredictor(predict, calibration)
    threshold = (calibration or {}).get("threshold") if calibrated else None
    return ServableModel(
        predict=predict,
        preprocessor=prep,
        config=config,
        epoch=int(meta["epoch"]),
        metrics=meta["metrics"],
        threshold=threshold,
        source=str(directory),
    )
