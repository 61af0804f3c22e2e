"""XGBoost (model.type xgboost): XGBoostTrainer's workers each read their Ray Data shard into a matrix (in memory, or
XGBoost's external-memory matrix when it would not fit: xgboost_extmem.py) and XGBoost's collective builds one model;
the round loop is the boosters' shared one (_trees.py). Embedded text columns are native categorical features."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
from pydantic import Field, model_validator

from trainflow.trainer.families.base import (
    booster_family,
    LeafwiseTreeParams,
    library_key,
    loss_from_metric,
    categorical_positions,
    outputs_from,
    trees_data_config,
)

if TYPE_CHECKING:
    from trainflow.config import Config, ScalingSection
    from trainflow.preprocessors.tabular import TabularPreprocessor

NAME = "xgboost"
XGB_MODEL = "model.ubj"  # XGBoost's own binary model format (not a pickle)


class XGBoostParams(LeafwiseTreeParams):
    """XGBoost's keys (model.params.xgboost): every booster's, and XGBoost's own."""

    gamma: float | None = library_key(ge=0.0)
    colsample_bynode: float | None = library_key(shown="`0.5` (trainflow's)", gt=0.0, le=1.0)
    tree_method: Literal["hist", "approx", "exact"] | None = library_key()
    max_leaves: int | None = library_key(ge=0)
    grow_policy: Literal["depthwise", "lossguide"] | None = library_key()
    max_cat_to_onehot: int | None = library_key(ge=1)
    external_memory: Literal["auto", "always", "never"] = Field(
        "auto",
        description="xgboost: read the shard into XGBoost's external-memory matrix (ExtMemQuantileDMatrix, pages on "
        "the worker's disk) instead of an in-memory one; `auto`: when the in-memory matrices would not fit",
    )

    @model_validator(mode="after")
    def _external_memory_hist(self) -> XGBoostParams:
        if self.external_memory == "always" and self.tree_method not in (None, "hist"):
            raise ValueError(
                f"external_memory 'always' needs tree_method 'hist' (XGBoost's external-memory "
                f"matrix is built for it), not {self.tree_method!r}"
            )
        return self


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


def library_params(prep: TabularPreprocessor, cfg: Config) -> dict[str, Any]:
    """XGBoost's parameters: objective and metric for the task, model.params, seed, threads, device."""
    from trainflow.trainer.families._trees import worker_threads

    chosen, scaling = cfg.model.params.for_family(NAME), cfg.scaling
    classes = prep.num_outputs if prep.task == "classification" else 0
    if prep.task == "regression":
        objective, metric = {"objective": "reg:squarederror"}, "rmse"
    elif classes == 2:
        objective, metric = {"objective": "binary:logistic"}, "logloss"
    else:
        objective, metric = {"objective": "multi:softprob", "num_class": classes}, "mlogloss"
    # colsample_bynode 0.5: better on the model-quality tables, never worse beyond noise (docs/performance.md)
    params = {
        "tree_method": "hist",
        "colsample_bynode": 0.5,
        **objective,
        "eval_metric": metric,
        "seed": cfg.split.seed,
        "nthread": worker_threads(scaling),
        **chosen,
    }
    if scaling.use_gpu:
        params["device"] = "cuda"
    return params


def train_fn(loop_config: dict[str, Any]) -> None:
    """XGBoostTrainer's per-worker loop: resume from the latest checkpoint's round, boost, report."""
    from trainflow.trainer import session
    from trainflow.trainer.families._trees import prepare

    run = prepare(loop_config, load_xgboost)
    if run is None:
        return
    prep = run.prep
    params = library_params(prep, loop_config["config"])
    with ExitStack() as cleanup:
        if run.budget.external_memory:
            from trainflow.trainer.families.xgboost_extmem import extmem_matrices

            cache = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="trainflow-xgboost-")))
            dtrain, dval, run.y_val = extmem_matrices(
                session.dataset_shard("train"),
                session.dataset_shard("val"),
                xgb_feature_types(prep),
                cache,
                params,
            )
        else:
            dtrain, dval = xgb_matrix(prep, run.x, run.y), xgb_matrix(prep, run.x_val, run.y_val)
        _boost(run, params, dtrain, dval)


def _boost(run, params: dict[str, Any], dtrain, dval) -> None:
    import xgboost as xgb

    prep, metric = run.prep, params["eval_metric"]

    base = run.offset  # a warm start's source rounds: this fit's round r is the booster's round base + r

    def save(model, rnd: int, d: Path) -> None:
        model[: base + rnd + 1].save_model(str(d / XGB_MODEL))

    def predict(model, rnd: int) -> np.ndarray:
        # on the DMatrix every rank built: building one on rank 0 alone is a collective call the others
        # never join, which kills the worker group
        return outputs_from(prep.task, prep.num_outputs, model.predict(dval, iteration_range=(0, base + rnd + 1)))

    reporter = run.reporter(NAME, save, predict)

    class Report(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch: int, evals_log) -> bool:
            train_loss = loss_from_metric(prep.task, evals_log["train"][metric][-1])
            val_loss = loss_from_metric(prep.task, evals_log["val"][metric][-1])
            # the callback's epoch counts from 0 again on a continued model; the booster's count is global
            return reporter.after_round(model, model.num_boosted_rounds() - 1 - base, train_loss, val_loss)

    xgb.train(
        params,
        dtrain,
        num_boost_round=run.budget.limit - run.start,
        evals=[(dtrain, "train"), (dval, "val")],
        xgb_model=run.model,
        callbacks=[Report()],
        verbose_eval=False,
    )


def _trainer(train_fn: Callable, scaling: ScalingSection, **kwargs: Any):
    from ray.train.xgboost import XGBoostConfig, XGBoostTrainer

    return XGBoostTrainer(train_fn, xgboost_config=XGBoostConfig(), **kwargs)


FAMILY = booster_family(
    NAME,
    _trainer,
    train_fn,
    trees_data_config,
    XGBoostPredictor,
    package="xgboost-cpu",
    params=XGBoostParams,
    library_params=library_params,
    external_memory=True,
    auto_rank=(2, 0),  # one split: first, the fastest on 4M streamed rows (170 s; docs/performance.md)
    listed=3,
)
