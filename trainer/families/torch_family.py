"""A user's nn.Module (model.type torch): imported by its configured class_path (LightningCLI style, never unpickled),
built as Class(in_features, out_features, **init_args), trained by the same loop as trainflow's network."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainflow.trainer.families import _torch

NAME = "torch"


class ModuleKeys(_torch.NetworkTrainKeys):
    """Your module's keys, in the model section itself (model.class_path, model.init_args), and its optimizer and
    schedule (_torch.NetworkTrainKeys)."""

    class_path: str | None = Field(
        None,
        description="torch: `package.module:ClassName` of your module, built as "
        "`ClassName(in_features, out_features, **init_args)`",
    )
    init_args: dict[str, Any] = Field(
        default_factory=dict, description="torch: keyword arguments of your module's constructor"
    )


def _check_config(model: Any, families: list[str]) -> None:
    if NAME in families and not model.class_path:
        raise ValueError(
            "model.type torch needs model.class_path, e.g. 'trainflow.examples.tabular_resnet:TabularResNet'"
        )
    if NAME not in families and (model.class_path or model.init_args):
        raise ValueError("model.class_path and model.init_args are for model.type: torch")


def _describe(model: dict[str, Any]) -> str:
    return f"`{model['class_path']}` with init_args {model['init_args']}"


FAMILY = _torch.torch_family(
    NAME,
    describe=_describe,
    imports_user_code=True,
    model_keys=ModuleKeys,
    check_config=_check_config,
    listed=2,
    serving_modules=("trainflow.trainer.families.network",),
)
