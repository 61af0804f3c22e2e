"""Serving a checkpoint of any family: its predictor behind one call, with no Ray, Prefect or MLflow imported.

This module, the checkpoint layout, the model and the preprocessor are what the registered MLflow model ships as
its code (tasks/register.py, code_paths), so it serves where trainflow is not installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.trainer.calibration import apply as apply_calibration, read_calibration
from trainflow.trainer.checkpoint import MODEL_FILE, load_weights, read_config, read_metrics
from trainflow.trainer.model import check_network_size, model_for

EPS = 1e-12


def outputs_from(task: str, num_outputs: int, pred: np.ndarray) -> np.ndarray:
    """The library's predictions as trainflow's model outputs: log-probabilities (a softmax gives the
    probabilities back) for classification, the standardized value for regression."""
    pred = np.asarray(pred, dtype=np.float64)
    if task == "regression":
        return pred.reshape(-1, 1).astype(np.float32)
    if num_outputs == 2 and pred.ndim == 1:
        pred = np.stack([1.0 - pred, pred], axis=1)
    return np.log(np.clip(pred.reshape(len(pred), num_outputs), EPS, 1.0)).astype(np.float32)



def categorical_positions(prep: TabularPreprocessor) -> list[int]:
    return [pos for pos, _, _ in prep.embedding_slots()]



XGB_MODEL = "model.ubj"


def xgb_feature_types(prep: TabularPreprocessor) -> list[str]:
    cats = set(categorical_positions(prep))
    return ["c" if i in cats else "q" for i in range(prep.num_features)]


def xgb_matrix(prep: TabularPreprocessor, x: np.ndarray, y: np.ndarray | None = None):
    import xgboost as xgb

    types = xgb_feature_types(prep)
    return xgb.DMatrix(x, label=y, feature_types=types, enable_categorical="c" in types, nthread=-1)


def load_xgboost(path: Path):
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(str(path / XGB_MODEL))
    return booster



class XGBoostPredictor:
    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
        self.booster, self.prep = load_xgboost(Path(directory)), prep
        if str(device).startswith("cuda"):
            self.booster.set_param({"device": "cuda"})

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return outputs_from(self.prep.task, self.prep.num_outputs, self.booster.predict(xgb_matrix(self.prep, x)))

    def native_importance(self) -> np.ndarray:
        """XGBoost's total gain per packed feature (features no tree splits on get 0)."""
        gains = self.booster.get_score(importance_type="total_gain")
        return np.array([gains.get(f"f{i}", 0.0) for i in range(self.prep.num_features)], dtype=np.float64)



LGB_MODEL = "model.txt"


def load_lightgbm(path: Path):
    import lightgbm as lgb

    return lgb.Booster(model_file=str(path / LGB_MODEL))



class LightGBMPredictor:
    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
        self.booster, self.prep = load_lightgbm(Path(directory)), prep

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return outputs_from(self.prep.task, self.prep.num_outputs, self.booster.predict(x))

    def native_importance(self) -> np.ndarray:
        """LightGBM's total gain per packed feature."""
        return np.asarray(self.booster.feature_importance(importance_type="gain"), dtype=np.float64)


CB_MODEL = "model.cbm"  # CatBoost's own binary model format (not a pickle)


def catboost_frame(prep: TabularPreprocessor, x: np.ndarray):
    """Packed features as the frame CatBoost reads: embedded text columns as integer categories, the rest numbers."""
    import pandas as pd

    frame = pd.DataFrame(np.asarray(x, dtype=np.float32), columns=[f"f{i}" for i in range(x.shape[1])])
    for pos in categorical_positions(prep):
        frame[f"f{pos}"] = np.nan_to_num(frame[f"f{pos}"].to_numpy(), nan=0.0).astype(np.int64)
    return frame


def catboost_outputs(model, prep: TabularPreprocessor, x: np.ndarray) -> np.ndarray:
    from catboost import Pool

    pool = Pool(catboost_frame(prep, x), cat_features=categorical_positions(prep) or None)
    kind = "Probability" if prep.task == "classification" else "RawFormulaVal"
    return outputs_from(prep.task, prep.num_outputs, model.predict(pool, prediction_type=kind))


def load_catboost(path: Path):
    from catboost import CatBoost

    model = CatBoost()
    model.load_model(str(path / CB_MODEL), format="cbm")
    return model


class CatBoostPredictor:
    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
        self.model, self.prep = load_catboost(Path(directory)), prep

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return catboost_outputs(self.model, self.prep, x)

    def native_importance(self) -> np.ndarray:
        """CatBoost's prediction-value change per packed feature (its default importance, gain-like)."""
        return np.asarray(self.model.get_feature_importance(), dtype=np.float64)


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
        return self.config["model"].get("type", "mlp")


class TorchPredictor:
    """A torch family's network from model.pt, checked for non-finite weights."""

    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device="cpu"):
        # the weights file bounds what its config may honestly ask for: check before building the network
        weights = directory / MODEL_FILE
        check_network_size(prep, config["model"], weights.stat().st_size + 2**20 if weights.is_file() else 0,
                           f"the size of {weights}")
        self.model = model_for(prep, config["model"])
        self.model.load_state_dict(load_weights(directory))
        for name, tensor in self.model.state_dict().items():
            if not torch.isfinite(tensor).all():
                raise ValueError(f"{directory / MODEL_FILE}: parameter {name} holds NaN or infinite values")
        self.device = device
        self.model.to(device).eval()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.model(torch.from_numpy(x).to(self.device)).float().cpu().numpy()


ENSEMBLE = "ensemble"
ENSEMBLE_FILE = "ensemble.json"
MEMBERS_DIR = "members"


def combine(task: str, outputs: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Several models' outputs as one: the weighted mean of their class probabilities (as log-probabilities, the
    outputs' form) or of their standardized values."""
    if task == "regression":
        return sum(w * np.asarray(o, np.float64) for o, w in zip(outputs, weights)).astype(np.float32)
    probs = sum(w * torch.softmax(torch.from_numpy(np.asarray(o, np.float32)), dim=1).double().numpy()
                for o, w in zip(outputs, weights))
    return np.log(np.clip(probs, EPS, 1.0)).astype(np.float32)


def read_ensemble(directory: str | Path) -> list[tuple[str, float]]:
    """(member family, weight) of an ensemble checkpoint, read strictly: each a family trainflow serves (no nested
    ensembles) at most once, whose folder is members/<family>; weights finite, positive and summing to 1."""
    path = Path(directory) / ENSEMBLE_FILE
    try:
        members = json.loads(path.read_text())["members"]
        pairs = [(m["family"], float(m["weight"])) for m in members]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not an ensemble trainflow wrote ({type(exc).__name__}: {exc})") from None
    families = [f for f, _ in pairs]
    bad = [f for f in families if f not in PREDICTORS or f == ENSEMBLE]
    weights = np.array([w for _, w in pairs])
    if (not pairs or bad or len(set(families)) != len(families) or not np.isfinite(weights).all()
            or (weights <= 0).any() or abs(weights.sum() - 1.0) > 1e-6):
        raise ValueError(f"{path}: members {pairs} are not distinct served families ({sorted(set(PREDICTORS) - {ENSEMBLE})}) "
                         "with positive weights summing to 1")
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
    return members + [fold_dir(d, k) for d in [Path(directory), *members] if (d / BAG_FILE).exists()
                      for k in range(read_bag(d))]


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
        raise ValueError(f"{path}: not a bagged checkpoint trainflow wrote ({type(exc).__name__}: {exc})") from None
    if not isinstance(folds, int) or isinstance(folds, bool) or not 2 <= folds <= MAX_FOLDS:
        raise ValueError(f"{path}: folds {folds!r} is not a whole number from 2 to {MAX_FOLDS}")
    return folds


def check_member(sub: Path, prep: TabularPreprocessor, family: str) -> dict[str, Any]:
    """A checkpoint inside another (an ensemble member, a fold model): the same preprocessing and the family the
    outer one names; its config."""
    if TabularPreprocessor.load(sub).to_dict() != prep.to_dict():
        raise ValueError(f"{sub}: its preprocessor.json differs from the checkpoint's that holds it")
    member_config = read_config(sub)
    if member_config["model"].get("type", "mlp") != family:
        raise ValueError(f"{sub / 'config.json'}: model.type is not {family!r}, as the checkpoint that holds it says")
    return member_config


class BaggedPredictor:
    """A family's fold models (folds/fold_<k>, each as the family's predictor, uncalibrated) served as one: their
    probabilities (or values) averaged; calibration, when the checkpoint holds one, applies to the average."""

    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
        family = config["model"].get("type", "mlp")
        if family == ENSEMBLE or family not in PREDICTORS:
            raise ValueError(f"{Path(directory) / BAG_FILE}: a bag of {family!r} models is not one trainflow serves")
        self.task, self.members = prep.task, []
        for k in range(read_bag(directory)):
            sub = fold_dir(directory, k)
            self.members.append(PREDICTORS[family](sub, prep, check_member(sub, prep, family), device))

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
    return PREDICTORS[config["model"].get("type", "mlp")](directory, prep, config, device)


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


# each family's predictor, built from a checkpoint folder; the checkpoint's config.json names its family
PREDICTORS: dict[str, Callable[..., Callable[[np.ndarray], np.ndarray]]] = {
    "mlp": TorchPredictor, "torch": TorchPredictor, "xgboost": XGBoostPredictor, "lightgbm": LightGBMPredictor,
    "catboost": CatBoostPredictor,
    ENSEMBLE: EnsemblePredictor,
}


def checkpoint_families(directory: str | Path) -> list[str]:
    """The families whose code serves a checkpoint: its own, or an ensemble's members'."""
    family = read_config(directory)["model"].get("type", "mlp")
    return [f for f, _ in read_ensemble(directory)] if family == ENSEMBLE else [family]


class CalibratedPredictor:
    """A classifier's predictor with the checkpoint's calibration applied to its outputs (trainer/calibration.py);
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
    family = config["model"].get("type", "mlp")
    if family not in PREDICTORS:
        raise ValueError(f"{directory / 'config.json'}: model.type {family!r} is not a family this trainflow serves "
                         f"({sorted(PREDICTORS)})")
    predict = predictor_for(directory, prep, config, str(device))
    calibration = read_calibration(directory) if prep.task == "classification" else None
    if calibration and calibration.get("method") and calibrated:
        predict = CalibratedPredictor(predict, calibration)
    threshold = (calibration or {}).get("threshold") if calibrated else None
    return ServableModel(predict=predict, preprocessor=prep, config=config, epoch=int(meta["epoch"]), metrics=meta["metrics"],
                         threshold=threshold, source=str(directory))
