"""Model families behind one interface: how each fits across Ray Train workers, what it needs before
training, and its budget. Checkpoints name their family (config.json's model.type) and
trainer/checkpoint.py's load_servable reads any of them, so everything after training is family-blind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ray.train import DataConfig
from ray.train.torch import TorchConfig, TorchTrainer

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.trainer.budget import resolve_budget
from trainflow.trainer.loop import TrainValDataConfig, train_fn_per_worker
from trainflow.trainer.model import check_model
from trainflow.config import BoosterParams, Config, ScalingSection, workers_share_gpus


def torch_config(scaling: ScalingSection) -> TorchConfig:
    """The process-group backend: scaling.backend, else Ray's default (NCCL with GPUs, Gloo without),
    except for workers that share a GPU (a fraction of one each), which get Gloo: NCCL refuses two
    ranks on one device ("Duplicate GPU detected"), Gloo all-reduces CUDA tensors through the host."""
    backend = scaling.backend
    if backend is None and workers_share_gpus(scaling.num_workers, scaling.use_gpu, scaling.resources_per_worker):
        backend = "gloo"
    return TorchConfig(backend=backend)


def _torch_trainer(train_fn: Callable, scaling: ScalingSection, **kwargs: Any):
    return TorchTrainer(train_fn, torch_config=torch_config(scaling), **kwargs)


def _xgboost_trainer(train_fn: Callable, scaling: ScalingSection, **kwargs: Any):
    from ray.train.xgboost import XGBoostConfig, XGBoostTrainer

    return XGBoostTrainer(train_fn, xgboost_config=XGBoostConfig(), **kwargs)


def _lightgbm_trainer(train_fn: Callable, scaling: ScalingSection, **kwargs: Any):
    from ray.train.lightgbm import LightGBMConfig, LightGBMTrainer

    return LightGBMTrainer(train_fn, lightgbm_config=LightGBMConfig(), **kwargs)


def _one_process_trainer(train_fn: Callable, scaling: ScalingSection, **kwargs: Any):
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return DataParallelTrainer(train_fn, **kwargs)


def _catboost_fn(loop_config: dict[str, Any]) -> None:
    from trainflow.trainer.catboost_fit import catboost_train_fn

    catboost_train_fn(loop_config)


def _one_process_data_config() -> DataConfig:
    return DataConfig(datasets_to_split=[])  # its one worker reads every training and validation row


def _xgboost_fn(loop_config: dict[str, Any]) -> None:
    from trainflow.trainer.boosting import xgboost_train_fn

    xgboost_train_fn(loop_config)


def _lightgbm_fn(loop_config: dict[str, Any]) -> None:
    from trainflow.trainer.boosting import lightgbm_train_fn

    lightgbm_train_fn(loop_config)


def _torch_budget(config: Config, train_rows: int, num_workers: int):
    return resolve_budget(config.train, train_rows, num_workers)


def _boost_budget(config: Config, train_rows: int, num_workers: int):
    from trainflow.trainer.boosting import boost_budget

    return boost_budget(config.model)


def _no_check(prep: TabularPreprocessor, model_cfg: dict[str, Any]) -> None:
    """Boosters take any packed width; their parameters were validated with the config."""


def _trees_data_config() -> DataConfig:
    # each worker boosts on its share of the training rows and evaluates the whole validation split,
    # so every rank computes the same validation loss and stops at the same round
    return DataConfig(datasets_to_split=["train"])


def _describe_mlp(model: dict[str, Any]) -> str:
    return (f"hidden sizes {model['hidden_sizes']}, dropout {model['dropout']}, "
            f"numeric embedding {model.get('numeric_embedding', 'none')}")


def _describe_module(model: dict[str, Any]) -> str:
    return f"`{model['class_path']}` with init_args {model['init_args']}"


def _describe_booster(family: str) -> Callable[[dict[str, Any]], str]:
    def describe(model: dict[str, Any]) -> str:
        return f"parameters {BoosterParams(**model['params']).for_family(family)}"

    return describe


@dataclass(frozen=True)
class Family:
    name: str
    make_trainer: Callable[..., Any]  # (train_fn, scaling section, **trainer kwargs) -> a Ray Train DataParallelTrainer
    train_fn: Callable[[dict[str, Any]], Any]  # the per-worker loop, given {"config": the family's Config, ...}
    data_config: Callable[[], DataConfig]
    budget: Callable[[Config, int, int], Any]  # (the family's config, training rows, workers) -> its budget
    check: Callable[[TabularPreprocessor, dict[str, Any]], None]  # before training: raises ValueError
    uses_minibatches: bool  # the torch loop's mini-batch memory check applies
    serving_packages: tuple[str, ...] = ()  # distributions its predictor imports beyond torch, numpy, pandas, pyarrow
    describe: Callable[[dict[str, Any]], str] = repr  # its settings from the resolved model section, for the model card
    external_memory: bool = False  # its workers can read their shard into an external-memory matrix (XGBoost)
    calibration: str = "temperature"  # what calibration.method auto fits for two classes (more: a temperature)
    class_weights: bool = True  # its loss takes train.class_weight
    # one process per fit (no data-parallel training): its one Ray Train worker holds the CPUs of the worker group
    one_process: bool = False

    def worker_scaling(self, scaling: ScalingSection) -> ScalingSection:
        """The scaling its Ray Train run asks for: the config's, or for a one-process family one CPU-only worker with
        the group's CPUs (at most the largest node's, where one worker must fit)."""
        if not self.one_process:
            return scaling
        from trainflow.trainer.resources import alive_nodes, worker_bundle

        cpus = worker_bundle({**scaling.model_dump(), "use_gpu": False}).get("CPU", 1.0) * max(1, scaling.num_workers)
        largest = max((n.get("CPU", 0.0) for n in alive_nodes()), default=cpus)
        res = {k: v for k, v in (scaling.resources_per_worker or {}).items() if k != "GPU"}
        return scaling.model_copy(update={"num_workers": 1, "use_gpu": False, "accelerator_type": None,
                                          "resources_per_worker": {**res, "CPU": max(1.0, min(cpus, largest))}})

    def uses_external_memory(self, mode: str, chosen: bool) -> bool:
        """Whether this run's workers build external-memory matrices: model.params.external_memory always, or
        auto where the preprocess task's memory check chose them (chosen)."""
        return self.external_memory and (mode == "always" or (mode == "auto" and chosen))


FAMILIES: dict[str, Family] = {
    "mlp": Family("mlp", _torch_trainer, train_fn_per_worker, TrainValDataConfig, _torch_budget, check_model, True,
                  ("rtdl-num-embeddings",), describe=_describe_mlp),
    "torch": Family("torch", _torch_trainer, train_fn_per_worker, TrainValDataConfig, _torch_budget, check_model, True,
                    describe=_describe_module),
    "xgboost": Family("xgboost", _xgboost_trainer, _xgboost_fn, _trees_data_config, _boost_budget, _no_check, False,
                      ("xgboost-cpu",), _describe_booster("xgboost"), external_memory=True, calibration="platt",
                      class_weights=False),
    "lightgbm": Family("lightgbm", _lightgbm_trainer, _lightgbm_fn, _trees_data_config, _boost_budget, _no_check, False,
                       ("lightgbm",), _describe_booster("lightgbm"), calibration="platt",
                       class_weights=False),
    "catboost": Family("catboost", _one_process_trainer, _catboost_fn, _one_process_data_config, _boost_budget,
                       _no_check, False, ("catboost",), _describe_booster("catboost"), calibration="platt",
                       class_weights=False, one_process=True),
}


def family_for(config: Config) -> Family:
    """The family of a single-family config (see Config.for_family)."""
    name = config.model.type
    if not isinstance(name, str):
        raise ValueError(f"model.type {name!r}: pick one family per training run (Config.for_family)")
    return FAMILIES[name]
