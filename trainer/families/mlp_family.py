"""trainflow's network (model.type mlp): an MLP over the packed features, with learned embeddings for wide text
columns and periodic embeddings for continuous values (trainer/families/network.py), trained data-parallel by
TorchTrainer with streaming_split (trainer/loop.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from trainflow.trainer.families import _torch


class NetworkKeys(_torch.NetworkTrainKeys):
    """The network's keys, in the model section itself (model.hidden_sizes, ...), as its checkpoints keep them: its
    layers and its optimizer and schedule (_torch.NetworkTrainKeys)."""

    hidden_sizes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [256, 128], description="mlp: the hidden layers' widths"
    )
    dropout: float = Field(0.3, description="mlp: dropout after each hidden layer", ge=0.0, lt=1.0)
    numeric_embedding: Literal["auto", "none", "periodic"] = Field(
        "auto",
        description="mlp: `periodic` passes each continuous value (numbers, date parts) through a periodic embedding "
        "(`rtdl_num_embeddings`' PLR: learned frequencies, sin and cos, a linear layer) before the layers; "
        "`none`: the standardized value as it is; `auto`: periodic up to 1,000,000 training rows "
        "([families.md](families.md#the-network))",
    )
    architecture: Literal["mlp", "tabm"] = Field(
        "mlp",
        description="mlp: the layers over the features: `mlp`, one MLP of `model.hidden_sizes`; `tabm`, TabM (the "
        "`tabm` package): an ensemble of `model.tabm_k` MLPs of len(hidden_sizes) layers of max(hidden_sizes) units "
        "that share their weights, trained together, served as their mean "
        "([families.md](families.md#tabm-modelarchitecture-tabm))",
    )
    tabm_k: int = Field(32, description="mlp with `architecture: tabm`: the ensemble's members", ge=2, le=128)


def _hashed(model: dict[str, Any]) -> dict[str, Any]:
    """The keys only TabM reads never change a plain MLP's training hash."""
    if model.get("architecture") == "mlp":
        return {k: v for k, v in model.items() if k not in ("architecture", "tabm_k")}
    return model


def _describe(model: dict[str, Any]) -> str:
    layers = f"TabM of {model['tabm_k']} members, " if model.get("architecture") == "tabm" else ""
    return (
        f"{layers}hidden sizes {model['hidden_sizes']}, dropout {model['dropout']}, "
        f"numeric embedding {model.get('numeric_embedding', 'none')}"
    )


FAMILY = _torch.torch_family(
    "mlp",
    warm_start=True,  # from the source network's weights, at a tenth of the learning rate (trainer/loop.py)
    serving_packages=("rtdl-num-embeddings", "tabm"),
    describe=_describe,
    search_space={
        "model.params.mlp.learning_rate": {"loguniform": [0.0003, 0.003]},
        "model.params.mlp.weight_decay": {"loguniform": [0.0001, 0.1]},
        "model.params.mlp.dropout": {"uniform": [0.0, 0.4]},
        "model.params.mlp.hidden_sizes": {"choice": [[256, 128], [512, 256], [256, 256, 128]]},
    },
    model_keys=NetworkKeys,
    # cross-fitting: last (its fits cost most on small tables); one split: second, the family least like the first
    auto_rank=(3, 1),
    # with train.time_limit in seconds, auto trains RealMLP in its place (docs/families.md#realmlp-modeltype-realmlp)
    auto_when="untimed",
    hashed=_hashed,
    listed=1,
    serving_modules=("trainflow.trainer.families.network",),
)
