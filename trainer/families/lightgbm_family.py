"""LightGBM (model.type lightgbm): LightGBMTrainer's workers each read their Ray Data shard into a Dataset and
LightGBM's data-parallel tree learner (its network from get_network_params) builds one model; the round loop is the
boosters' shared one (_trees.py). Embedded text columns are native categorical features."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from trainflow.trainer.families.base import (
    booster_family,
    LeafwiseTreeParams,
    library_key,
    categorical_positions,
    outputs_from,
    trees_data_config,
)

if TYPE_CHECKING:
    from trainflow.config import Config, ScalingSection
    from trainflow.preprocessors.tabular import TabularPreprocessor

NAME = "lightgbm"
LGB_MODEL = "model.txt"  # LightGBM's own text model format


class LightGBMParams(LeafwiseTreeParams):
    """LightGBM's keys (model.params.lightgbm): every booster's, and LightGBM's own."""

    num_leaves: int | None = library_key(ge=2)
    min_data_in_leaf: int | None = library_key(ge=0)
    min_split_gain: float | None = library_key(ge=0.0)
    cat_smooth: float | None = library_key(ge=0.0)


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


def library_params(prep: TabularPreprocessor, cfg: Config) -> dict[str, Any]:
    """LightGBM's parameters: objective and metric for the task, model.params, seed, threads, device."""
    from trainflow.trainer.families._trees import worker_threads

    chosen, scaling = cfg.model.params.for_family(NAME), cfg.scaling
    if prep.task == "regression":
        objective = {"objective": "regression", "metric": "l2"}
    elif prep.num_outputs == 2:
        objective = {"objective": "binary", "metric": "binary_logloss"}
    else:
        objective = {"objective": "multiclass", "num_class": prep.num_outputs, "metric": "multi_logloss"}
    params = {
        **objective,
        "seed": cfg.split.seed,
        "num_threads": worker_threads(scaling),
        "verbosity": -1,
        "deterministic": True,
        **chosen,
    }
    if chosen.get("subsample", 1.0) < 1.0:
        params["subsample_freq"] = 1  # LightGBM bags rows only with a bagging frequency
    if scaling.use_gpu:
        params["device_type"] = "gpu"
    return params


def train_fn(loop_config: dict[str, Any]) -> None:
    """LightGBMTrainer's per-worker loop: resume from the latest checkpoint's round, boost, report."""
    import lightgbm as lgb
    import ray.train

    from trainflow.trainer.families._trees import prepare

    run = prepare(loop_config, load_lightgbm)
    if run is None:
        return
    prep = run.prep
    params = library_params(prep, loop_config["config"])
    if ray.train.get_context().get_world_size() > 1:
        from ray.train.lightgbm import get_network_params

        params.update({"tree_learner": "data_parallel", "pre_partition": True, **get_network_params()})
    cats = categorical_positions(prep) or "auto"
    train_set = lgb.Dataset(run.x, label=run.y, categorical_feature=cats, free_raw_data=False)
    val_set = lgb.Dataset(
        run.x_val, label=run.y_val, categorical_feature=cats, reference=train_set, free_raw_data=False
    )

    base = run.offset  # a warm start's source rounds: this fit's round r is the booster's iteration base + r

    def save(model, rnd: int, d: Path) -> None:
        model.save_model(str(d / LGB_MODEL), num_iteration=base + rnd + 1)

    def predict(model, rnd: int) -> np.ndarray:
        return outputs_from(prep.task, prep.num_outputs, model.predict(run.x_val, num_iteration=base + rnd + 1))

    reporter = run.reporter(NAME, save, predict)

    def report(env) -> None:
        losses = {name: value for name, _, value, _ in env.evaluation_result_list}
        if reporter.after_round(env.model, env.iteration - base, losses["train"], losses["val"]):
            raise lgb.callback.EarlyStopException(env.iteration, env.evaluation_result_list)

    report.order = 30  # after LightGBM's own callbacks

    lgb.train(
        params,
        train_set,
        num_boost_round=run.budget.limit - run.start,
        valid_sets=[train_set, val_set],
        valid_names=["train", "val"],
        init_model=run.model,
        callbacks=[report],
    )


def _trainer(train_fn: Callable, scaling: ScalingSection, **kwargs: Any):
    from ray.train.lightgbm import LightGBMConfig, LightGBMTrainer

    return LightGBMTrainer(train_fn, lightgbm_config=LightGBMConfig(), **kwargs)


FAMILY = booster_family(
    NAME,
    _trainer,
    train_fn,
    trees_data_config,
    LightGBMPredictor,
    package="lightgbm",
    params=LightGBMParams,
    library_params=library_params,
    # cross-fitting: second, a strong default; one split: last, the booster most like XGBoost (364 s on 4M rows)
    auto_rank=(1, 3),
    listed=4,
)
