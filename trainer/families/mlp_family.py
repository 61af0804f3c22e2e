"""trainflow's network (model.type mlp): an MLP over the packed features, with learned embeddings for wide text
columns and periodic embeddings for continuous values (trainer/families/network.py), trained data-parallel by
TorchTrainer with streaming_split (trainer/loop.py)."""

from __future__ import annotations

from typing import Any

from trainflow.trainer.families import _torch
from trainflow.trainer.families.base import Family
from trainflow.trainer.families.network import check_model


def _describe(model: dict[str, Any]) -> str:
    layers = f"TabM of {model['tabm_k']} members, " if model.get("architecture") == "tabm" else ""
    return (
        f"{layers}hidden sizes {model['hidden_sizes']}, dropout {model['dropout']}, "
        f"numeric embedding {model.get('numeric_embedding', 'none')}"
    )


FAMILY = Family(
    "mlp",
    _torch.torch_trainer,
    _torch.train_fn,
    _torch.data_config,
    _torch.epoch_budget,
    _torch.TorchPredictor,
    check_model,
    uses_minibatches=True,
    serving_packages=("rtdl-num-embeddings", "tabm"),
    describe=_describe,
    search_space={
        "train.learning_rate": {"loguniform": [0.0003, 0.003]},
        "train.weight_decay": {"loguniform": [0.0001, 0.1]},
        "model.dropout": {"uniform": [0.0, 0.4]},
        "model.hidden_sizes": {"choice": [[256, 128], [512, 256], [256, 256, 128]]},
    },
)
