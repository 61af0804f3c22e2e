"""What the torch families (trainflow's network, a user's nn.Module) share: the TorchTrainer over trainer/loop.py's
per-worker loop, the epoch budget, and the predictor that serves model.pt.

torch is imported where a network is built, trained or served, not with this module: the config imports every family
(its keys), and a booster's Ray Train processes, which unpickle the config, would otherwise each import torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
from pydantic import Field, field_validator

from trainflow.limits import MAX_AUTO_EPOCHS, MAX_BATCH, MIN_AUTO_EPOCHS, MIN_BATCH, ROWS_PER_STEP, TARGET_STEPS
from trainflow.trainer.families.base import Family, Params

if TYPE_CHECKING:
    from trainflow.config import Config, ScalingSection
    from trainflow.preprocessors.tabular import TabularPreprocessor


class NetworkTrainKeys(Params):
    """The optimizer and schedule keys of the networks trainer/loop.py trains with AdamW (mlp, torch):
    model.params.<family>.<key>, kept in the model section itself as their other keys are (their earlier place,
    train.<key>, is read with a warning until the next release)."""

    epochs: int | Literal["auto"] = Field(
        "auto",
        description=f"mlp, torch: the most epochs (early stopping may end sooner); `auto`: about {TARGET_STEPS:,} "
        f"optimizer steps per worker, {MIN_AUTO_EPOCHS}-{MAX_AUTO_EPOCHS} epochs, from the training rows and the "
        "workers",
    )
    batch_size: int | Literal["auto"] = Field(
        "auto",
        description=f"mlp, torch: rows per optimizer step per worker; `auto`: rows per worker / {ROWS_PER_STEP} as a "
        f"power of two, {MIN_BATCH}-{MAX_BATCH}",
    )
    learning_rate: float = Field(1e-3, description="mlp, torch: AdamW's peak learning rate", gt=0.0)
    weight_decay: float = Field(0.01, description="mlp, torch: AdamW's decoupled weight decay", ge=0.0)
    schedule: Literal["cosine", "constant"] = Field(
        "cosine",
        description="mlp, torch: the per-step learning rate after the warm-up: `cosine` (to 0 at the last epoch) or "
        "`constant`",
    )
    warmup_fraction: float = Field(
        0.05, description="mlp, torch: the linear warm-up, as a fraction of all steps", ge=0.0, lt=1.0
    )
    label_smoothing: float = Field(
        0.0,
        description="mlp, torch, classification: train on cross-entropy against labels smoothed by this much; "
        "validation metrics, early stopping and every choice read the plain loss",
        ge=0.0,
        lt=1.0,
    )

    @field_validator("epochs", "batch_size")
    @classmethod
    def _at_least_one(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v

    @field_validator("learning_rate", "weight_decay")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


NETWORK_TRAIN_KEYS = tuple(NetworkTrainKeys.model_fields)


class NetworkTrain(NetworkTrainKeys):
    """What a torch family's loop trains with (Family.train_section): its optimizer and schedule keys, and
    train.early_stopping and train.class_weight, which are the run's."""

    early_stopping: Any
    class_weight: Any = None


def network_train_section(config: Config) -> NetworkTrain:
    """The loop's train section of a network whose keys are in the model section (mlp, torch)."""
    return NetworkTrain(
        **{k: getattr(config.model, k) for k in NETWORK_TRAIN_KEYS},
        early_stopping=config.train.early_stopping,
        class_weight=config.train.class_weight,
    )


def torch_config(scaling: ScalingSection):
    """The process-group backend: scaling.backend, else Ray's default (NCCL with GPUs, Gloo without),
    except for workers that share a GPU (a fraction of one each), which get Gloo: NCCL refuses two
    ranks on one device ("Duplicate GPU detected"), Gloo all-reduces CUDA tensors through the host."""
    from ray.train.torch import TorchConfig

    from trainflow.config import workers_share_gpus

    backend = scaling.backend
    if backend is None and workers_share_gpus(scaling.max_workers, scaling.use_gpu, scaling.resources_per_worker):
        backend = "gloo"
    return TorchConfig(backend=backend)


def torch_trainer(train_fn: Callable, scaling: ScalingSection, **kwargs: Any):
    from ray.train.torch import TorchTrainer

    return TorchTrainer(train_fn, torch_config=torch_config(scaling), **kwargs)


def train_fn(loop_config: dict[str, Any]) -> None:
    from trainflow.trainer.loop import train_fn_per_worker

    train_fn_per_worker(loop_config)


def data_config():
    """'train' in equal shards (DDP needs the same steps on every rank) and 'val' in unequal ones, so every
    validation row is evaluated exactly once."""
    from trainflow.trainer.shards import ShardConfig

    return ShardConfig({"train": True, "val": False})


def epoch_budget(config: Config, train_rows: int, num_workers: int):
    """The epochs and batches of the family's train section (Family.train_section)."""
    from trainflow.trainer.budget import resolve_budget
    from trainflow.trainer.families import family_for

    return resolve_budget(family_for(config).train_section(config), train_rows, num_workers)


def build_network(prep: TabularPreprocessor, model_cfg: dict[str, Any]):
    """trainflow's network, or a user's module (model.type torch): trainer/families/network.py model_for."""
    from trainflow.trainer.families.network import model_for

    return model_for(prep, model_cfg)


class TorchPredictor:
    """A torch family's network from model.pt, checked for non-finite weights."""

    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device="cpu"):
        import torch

        from trainflow.trainer.serving.checkpoint import MODEL_FILE, load_weights
        from trainflow.trainer.families.network import built, check_network_size

        # the weights file bounds what its config may honestly ask for: check before building the network
        weights = directory / MODEL_FILE
        check_network_size(
            prep, config["model"], weights.stat().st_size + 2**20 if weights.is_file() else 0, f"the size of {weights}"
        )
        self.model = built(prep, config["model"])
        self.model.load_state_dict(load_weights(directory))
        for name, tensor in self.model.state_dict().items():
            if not torch.isfinite(tensor).all():
                raise ValueError(f"{directory / MODEL_FILE}: parameter {name} holds NaN or infinite values")
        self.device = device
        self.model.to(device).eval()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return self.model(torch.from_numpy(x).to(self.device)).float().cpu().numpy()


def check_model(prep: TabularPreprocessor, model_cfg: dict[str, Any]) -> None:
    """The network's checks before training (trainer/families/network.py check_model)."""
    from trainflow.trainer.families.network import check_model as check

    check(prep, model_cfg)


def torch_family(name: str, **own: Any) -> Family:
    """A family the torch loop trains (trainer/loop.py): what they share (TorchTrainer over the loop, the shards'
    data config, an epoch budget from its train section, the predictor of model.pt, the network checks, mini-batches
    streamed) around its own fields (own: its network's builder, train section, optimizer, keys, ...; by default
    trainflow's network builder, network.py model_for)."""
    return Family(
        name,
        torch_trainer,
        train_fn,
        data_config,
        epoch_budget,
        TorchPredictor,
        check_model,
        uses_minibatches=True,
        train_keys=NETWORK_TRAIN_KEYS,
        **{"build": build_network, "train_section": network_train_section, **own},
    )
