"""A user's nn.Module (model.type torch): imported by its configured class_path (LightningCLI style, never unpickled),
built as Class(in_features, out_features, **init_args), trained by the same loop as trainflow's network."""

from __future__ import annotations

from typing import Any

from trainflow.trainer.families import _torch
from trainflow.trainer.families.base import Family
from trainflow.trainer.families.network import check_model


def _describe(model: dict[str, Any]) -> str:
    return f"`{model['class_path']}` with init_args {model['init_args']}"


FAMILY = Family(
    "torch",
    _torch.torch_trainer,
    _torch.train_fn,
    _torch.data_config,
    _torch.epoch_budget,
    _torch.TorchPredictor,
    check_model,
    uses_minibatches=True,
    describe=_describe,
    imports_user_code=True,
)
