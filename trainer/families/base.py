"""The interface every model family implements, and what the families' predictors share.

Nothing here imports Ray, the config module or a booster library at import time: the registered model ships this
package as its serving code (tasks/model_package.py), so a family's file keeps its training imports inside the
functions that train.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from pathlib import Path

    from trainflow.config import Config, ScalingSection
    from trainflow.preprocessors.tabular import TabularPreprocessor

EPS = 1e-12


def outputs_from(task: str, num_outputs: int, pred: np.ndarray) -> np.ndarray:
    """A library's predictions as trainflow's model outputs: log-probabilities (a softmax gives the
    probabilities back) for classification, the standardized value for regression."""
    pred = np.asarray(pred, dtype=np.float64)
    if task == "regression":
        return pred.reshape(-1, 1).astype(np.float32)
    if num_outputs == 2 and pred.ndim == 1:
        pred = np.stack([1.0 - pred, pred], axis=1)
    return np.log(np.clip(pred.reshape(len(pred), num_outputs), EPS, 1.0)).astype(np.float32)


def categorical_positions(prep: TabularPreprocessor) -> list[int]:
    """The packed positions of the text columns the preprocessor embeds (their integer codes)."""
    return [pos for pos, _, _ in prep.embedding_slots()]


def loss_from_metric(task: str, value: float) -> float:
    """A booster's evaluation metric as trainflow's loss: RMSE squared (MSE on the standardized label) for regression,
    log loss as it is."""
    return value * value if task == "regression" else value


def no_check(prep: TabularPreprocessor, model_cfg: dict[str, Any]) -> None:
    """Boosters take any packed width; their parameters were validated with the config."""


def library_key(default: Any = None, *, named: str | None = None, shown: str | None = None, **bounds: Any) -> Any:
    """A key passed to the family's library as it is (named: under the library's own name); unset (None), the
    library's default. Its description names the families that take it (made from the catalogue by the config)."""
    extra = {k: v for k, v in (("x-library-name", named), ("x-default", shown)) if v}
    return Field(default, json_schema_extra=extra or None, **bounds)


class Params(BaseModel):
    """A family's own keys, `model.params.<family>` (unknown keys refused). A key several families take means the
    same for each; a key whose default is None is the library's own, passed on only when set."""

    model_config = ConfigDict(extra="forbid")


class TreeParams(Params):
    """What every gradient-boosted trees family takes."""

    num_boost_round: int = Field(
        1000, description="the most boosting rounds; early stopping ends most runs well before", ge=1
    )
    early_stopping_rounds: int | Literal["off"] = Field(
        50, description="rounds without a better validation loss before stopping, or `off`"
    )
    learning_rate: float = Field(
        0.1,
        description="the boosters' step size (HistGradientBoosting's and LightGBM's default; "
        "XGBoost's own is 0.3; CatBoost picks its own for the table unless this is set)",
        gt=0.0,
    )
    max_depth: int | None = library_key(ge=-1)
    subsample: float | None = library_key(gt=0.0, le=1.0)
    reg_lambda: float | None = library_key(ge=0.0)
    max_bin: int | None = library_key(ge=2)

    @field_validator("early_stopping_rounds")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1, or 'off'")
        return v


class LeafwiseTreeParams(TreeParams):
    """What XGBoost and LightGBM both take beyond every booster's keys."""

    min_child_weight: float | None = library_key(ge=0.0)
    colsample_bytree: float | None = library_key(gt=0.0, le=1.0)
    reg_alpha: float | None = library_key(ge=0.0)


# a booster's keys trainflow reads (its budget, its matrices) and never passes to the library
BUDGET_KEYS = ("num_boost_round", "early_stopping_rounds", "external_memory")


# (directory, fitted preprocessor, the checkpoint's config.json, device) -> packed features -> model outputs
Predictor = Callable[..., Callable[[np.ndarray], np.ndarray]]


# the boosters' default sweep (model.params keys every booster maps to its library's own: trainflow/config/model.py)
BOOSTER_SPACE = {
    "model.params.learning_rate": {"loguniform": [0.01, 0.3]},
    "model.params.max_depth": {"randint": [3, 11]},
    "model.params.subsample": {"uniform": [0.6, 1.0]},
    "model.params.reg_lambda": {"loguniform": [0.01, 10.0]},
}


@dataclass(frozen=True)
class Family:
    """One model family: how it trains across Ray Train workers, what it checks before, and how its checkpoint serves.
    Listed once in trainer/families/__init__.py's REGISTRY; nothing outside this folder names a family."""

    name: str
    make_trainer: Callable[..., Any]  # (train_fn, scaling section, **trainer kwargs) -> a Ray Train DataParallelTrainer
    train_fn: Callable[[dict[str, Any]], Any]  # the per-worker loop, given {"config": the family's Config, ...}
    data_config: Callable[[], Any]  # -> its ray.train.DataConfig (which datasets each worker gets a shard of)
    budget: Callable[[Config, int, int], Any]  # (the family's config, training rows, workers) -> its budget
    predictor: Predictor  # serves a checkpoint folder of this family
    check: Callable[[TabularPreprocessor, dict[str, Any]], None] = no_check  # before training: raises ValueError
    uses_minibatches: bool = False  # the torch loop's mini-batch memory check applies; it streams its epochs
    serving_packages: tuple[str, ...] = ()  # distributions its predictor imports beyond torch, numpy, pandas, pyarrow
    # trainflow modules its predictor imports inside its functions: a registered model ships them too (what its file
    # imports at its top level is found by tasks/model_package.py serving_modules)
    serving_modules: tuple[str, ...] = ()
    describe: Callable[[dict[str, Any]], str] = repr  # its settings from the resolved model section, for the model card
    external_memory: bool = False  # its workers can read their shard into an external-memory matrix (XGBoost)
    warm_start: bool = False  # its loop continues a source model (train.warm_start): its rounds, or its weights
    calibration: str = "temperature"  # what calibration.method auto fits for two classes (more: a temperature)
    class_weights: bool = True  # its loss takes train.class_weight
    # one process per fit (no data-parallel training): its one Ray Train worker holds the CPUs of the worker group
    one_process: bool = False
    imports_user_code: bool = False  # builds the nn.Module model.class_path names (the allow-list applies)
    # boosters: (fitted preprocessor, the family's Config) -> the library's parameters for the run
    library_params: Callable[[TabularPreprocessor, Config], dict[str, Any]] | None = None
    # train.refit: its chosen models can be trained again on more rows for a fixed count of steps (flows/refit.py);
    # refit_params: the model.params values (refit_pins) its chosen models' checkpoint folders hold that a refit keeps
    refits: bool = False
    refit_params: Callable[[list[Path]], dict[str, Any]] | None = None
    # (the family's config, its rounds, the pinned values) -> its config for a refit of that many rounds without early
    # stopping (the boosters': model.params.num_boost_round)
    refit_config: Callable[[Config, int, dict[str, Any]], Config] | None = None
    refit_pins: tuple[str, ...] = ()
    # the keys of its model section that are its optimizer and schedule (the networks'): a training hash counts them
    # with the train section's, where they were before they moved (Config.training_hash)
    train_keys: tuple[str, ...] = ()
    # `trainflow tune` without tune.search_space: its default space (dotted config key -> {kind: args})
    search_space: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    # its keys: a Params class validating model.params.<name> (and the shared model.params keys it takes), and the
    # keys it reads from the model section itself (the networks': their checkpoints keep that layout)
    params: type[Params] | None = None
    model_keys: type[Params] | None = None
    trainflow_keys: tuple[str, ...] = ()  # its params trainflow reads and never passes to the library
    # model.type auto: its place among the families when cross-fitting (small tables) and on one split; None: not in
    # auto. Cross-fitting runs the strongest defaults first; one split the fastest first, because its time sets
    # train.time_limit auto's budget for the rest (trainflow/config/model.py training_order)
    auto_rank: tuple[int, int] | None = None
    # which auto runs train it: always; only those given train.time_limit in seconds (the user gave the time: a
    # family that earns its place with it, and would break a default run's cost without it); or only the others
    auto_when: Literal["always", "timed", "untimed"] = "always"
    # checks of the config before anything runs, given its model section and the families the run trains: raises
    # ValueError naming the key
    check_config: Callable[[Any, list[str]], None] | None = None
    # its part of the training hash, from its model section as its run reads it (keys that cannot change its weights
    # left out)
    hashed: Callable[[dict[str, Any]], dict[str, Any]] = lambda model: model
    listed: int = 1000  # its place where families are listed (model.type's choices, the docs): the order they came
    # a family trained by the torch loop (trainer/loop.py) owns its fit through these three: its network, built for a
    # fitted preprocessor from its model section as a checkpoint's config.json holds it (training and serving build it
    # the same way); the train section its loop runs with, given its Config (a family with its own keys under
    # model.params.<family> maps them there: batch size, epochs, learning rate, label smoothing); and its optimizer
    # and schedule, (network, that train section, the run's optimizer steps) -> (optimizer, a torch LR scheduler
    # stepped once per step), None: AdamW with its schedule key (trainer/loop.py make_optimizer)
    build: Callable[[TabularPreprocessor, dict[str, Any]], Any] | None = None
    train_section: Callable[[Config], Any] = lambda config: config.train
    optimizer: Callable[[Any, Any, int], tuple[Any, Any]] | None = None

    def worker_scaling(self, scaling: ScalingSection) -> ScalingSection:
        """The scaling its Ray Train run asks for: the config's, or for a one-process family one CPU-only worker with
        the group's CPUs (at most the largest node's, where one worker must fit)."""
        if not self.one_process:
            return scaling
        from trainflow.trainer.resources import alive_nodes, worker_bundle

        cpus = worker_bundle({**scaling.model_dump(), "use_gpu": False}).get("CPU", 1.0) * max(1, scaling.min_workers)
        largest = max((n.get("CPU", 0.0) for n in alive_nodes()), default=cpus)
        res = {k: v for k, v in (scaling.resources_per_worker or {}).items() if k != "GPU"}
        return scaling.model_copy(
            update={
                "num_workers": 1,
                "use_gpu": False,
                "accelerator_type": None,
                "resources_per_worker": {**res, "CPU": max(1.0, min(cpus, largest))},
            }
        )

    def plan_memory(
        self,
        prep: TabularPreprocessor,
        config: Config,
        budget: Any,
        rows: tuple[int, int],
        workers: int,
        memory: float,
        source: str,
    ) -> tuple[dict[str, Any], Any]:
        """Its memory plan: whether its training data fits a worker's share of the cluster's memory (rows: training
        and validation rows; memory: the cluster's bytes), and its budget as the plan leaves it: (the estimate, the
        budget). DataError naming the table and the reason when it does not fit. A mini-batch family streams its
        epochs (its working set of batches counts); any other holds its rows as matrices (a one-process family's
        one worker holds every training row; XGBoost's may page them to disk: external_memory)."""
        from dataclasses import replace

        from trainflow.trainer.memory import check_booster_matrix, check_packed_size

        train_rows, val_rows = rows
        if self.uses_minibatches:
            return check_packed_size(
                prep, train_rows + val_rows, budget.batch_size, max(1, workers), memory, source
            ), budget
        fits = check_booster_matrix(
            prep,
            train_rows,
            val_rows,
            1 if self.one_process else max(1, workers),
            memory,
            source,
            config.model.params.external_memory if self.external_memory else None,
        )
        return fits, replace(budget, external_memory=fits["external_memory"])

    def uses_external_memory(self, mode: str, chosen: bool) -> bool:
        """Whether this run's workers build external-memory matrices: model.params.external_memory always, or
        auto where the preprocess task's memory check chose them (chosen)."""
        return self.external_memory and (mode == "always" or (mode == "auto" and chosen))


def booster_budget(config: Config, train_rows: int, num_workers: int):
    """A booster's budget: model.params' rounds and early stopping."""
    from trainflow.trainer.families._trees import boost_budget

    return boost_budget(config.model)


def booster_refit_config(resolved: Config, rounds: int, pinned: dict[str, Any]) -> Config:
    """A booster's config for its refit: its params with rounds fixed, early stopping off and pinned values."""
    params = resolved.model.params.model_copy(
        update={"num_boost_round": rounds, "early_stopping_rounds": "off", **pinned}
    )
    return resolved.model_copy(update={"model": resolved.model.model_copy(update={"params": params})})


def describe_booster(family: str) -> Callable[[dict[str, Any]], str]:
    def describe(model: dict[str, Any]) -> str:
        from trainflow.config import ParamsSection

        return f"parameters {ParamsSection(**model['params']).resolved(family).for_family(family)}"

    return describe


def booster_family(
    name: str,
    make_trainer: Callable[..., Any],
    train_fn: Callable[[dict[str, Any]], Any],
    data_config: Callable[[], Any],
    predictor: Predictor,
    *,
    package: str,
    params: type[Params],
    library_params: Callable[..., dict[str, Any]],
    **own: Any,
) -> Family:
    """A gradient-boosted trees family: what the boosters share (model.params' rounds and early stopping as its
    budget, Platt scaling, a continuation for train.warm_start, no class weights, the booster search space, its
    parameters described from model.params) around its own trainer, loop, predictor, library and keys; own: the rest
    of its Family fields (its place in auto, external memory, one process)."""
    return Family(
        name,
        make_trainer,
        train_fn,
        data_config,
        booster_budget,
        predictor,
        serving_packages=(package,),
        describe=describe_booster(name),
        calibration="platt",
        warm_start=True,
        class_weights=False,
        library_params=library_params,
        search_space=BOOSTER_SPACE,
        params=params,
        trainflow_keys=BUDGET_KEYS,
        refits=True,
        refit_config=booster_refit_config,
        **own,
    )


def one_process_trainer(train_fn: Callable, scaling: ScalingSection, **kwargs: Any):
    """A one-process family's Ray Train run: a plain DataParallelTrainer of its one worker (Family.worker_scaling)."""
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return DataParallelTrainer(train_fn, **kwargs)


def whole_data_config():
    """A one-process family's one worker reads every training and validation row."""
    from trainflow.trainer.shards import ShardConfig

    return ShardConfig({})


def trees_data_config():
    """Each worker boosts on its share of the training rows and evaluates the whole validation split, so every rank
    computes the same validation loss and stops at the same round."""
    from trainflow.trainer.shards import ShardConfig

    return ShardConfig({"train": True})
