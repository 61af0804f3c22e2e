"""RealMLP (model.type realmlp): the network recipe of Holzmüller, Grinsztajn and Steinwart, "Better by Default:
Strong Pre-Tuned MLPs and Boosted Trees on Tabular Data" (NeurIPS 2024), with RealMLP-TD's published defaults, over
trainflow's packed features, trained by trainer/loop.py across Ray Train workers as the network is (data-parallel,
checkpointed each epoch, resumed after a lost worker) and served from model.pt through pyfunc. This file is the whole
family: its keys (model.params.realmlp.*), its network, the train section its loop runs with and its optimizer and
schedule (Family.build, .train_section, .optimizer).

The recipe is implemented here from the paper and pytabkit's reference (pytabkit 1.8.0, pytabkit/models/realmlp)
rather than imported: pytabkit's module takes (numbers, categories) with a leading models dimension and trains in its
own loop over the whole training set in one process, where a Ray Train worker streams its shard and resumes from a
checkpoint; and a registered model importing it would need pytabkit and PyTorch Lightning where it serves. What it
takes from the recipe: robust scaling and smooth clipping of the inputs; PBLD embeddings of continuous values; a
learned scale in front; NTK-parametrized layers with parametric SELU (classification) or Mish (regression)
activations; per-parameter learning-rate and weight-decay factors; AdamW with betas (0.9, 0.95); the coslog4
learning-rate schedule and flat-cos weight-decay and dropout schedules; label smoothing 0.1 for classification; 256
epochs of batches of 256, the best epoch kept. Where it differs: the scaling's medians and spreads come from the first
training batch (a data-dependent initialization, kept with the weights), not every training row; the weights start
as plain normal draws under the NTK scale and the biases at zero, not rescaled on a first batch (a parameter changed
by one worker's data would differ between data-parallel workers); one-hot and embedded text columns are trainflow's
preprocessor's, each embedded one 8 wide.

Nothing here imports torch at import time: the config reads this file for its keys."""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal

from pydantic import Field

from trainflow.trainer.families import _torch
from trainflow.trainer.families.base import Params

NAME = "realmlp"
PBLD_FREQUENCIES = 16  # each continuous value's periodic features (cos of a learned frequency and phase) ...
PBLD_OUT = 3  # ... mapped linearly to this many, then the value itself beside them
SCALING_ROWS = 8192  # the first batch's rows the input scaling is taken from, at most


class RealMLPParams(Params):
    """model.params.realmlp: RealMLP-TD's defaults (the paper's Table; pytabkit's RealMLPConfig.td_class/td_reg)."""

    n_hidden_layers: int = Field(3, description="realmlp: hidden layers", ge=1, le=16)
    hidden_width: int = Field(256, description="realmlp: units per hidden layer", ge=1)
    act: Literal["auto", "selu", "mish", "relu", "silu"] = Field(
        "auto", description="realmlp: the activation (parametric); `auto`: SELU for classification, Mish for regression"
    )
    lr: float | Literal["auto"] = Field(
        "auto", description="realmlp: AdamW's peak learning rate; `auto`: 0.04 for classification, 0.2 for regression"
    )
    wd: float = Field(0.02, description="realmlp: weight decay (its schedule: flat, then cosine to 0)", ge=0.0)
    p_drop: float = Field(0.15, description="realmlp: dropout (its schedule: flat, then cosine to 0)", ge=0.0, lt=1.0)
    ls_eps: float = Field(0.1, description="realmlp: label smoothing for classification", ge=0.0, lt=1.0)
    n_epochs: int = Field(
        256, description="realmlp: epochs (the best one is kept; train.time_limit still ends it)", ge=1
    )
    batch_size: int = Field(256, description="realmlp: rows per step and worker", ge=1)
    patience: Annotated[int, Field(ge=1)] | Literal["off"] = Field(
        "off",
        description="realmlp: epochs without a better validation loss before stopping, or `off` (the recipe: "
        "every epoch, the best kept; its learning rate rises and falls four times)",
    )
    plr_sigma: float = Field(0.1, description="realmlp: the spread of the PBLD embeddings' initial frequencies", gt=0.0)
    embedding_size: int = Field(8, description="realmlp: the width of an embedded text column's vectors", ge=1)


def settings(model_cfg: dict[str, Any]) -> RealMLPParams:
    """The family's keys from its model section as its run and its checkpoint's config.json hold them (a config's
    for_family form: model.params.realmlp's block resolved into model.params)."""
    params = model_cfg.get("params") or {}
    return RealMLPParams(**{k: params[k] for k in RealMLPParams.model_fields if params.get(k) is not None})


def _peak_lr(p: RealMLPParams, classification: bool) -> float:
    return p.lr if p.lr != "auto" else (0.04 if classification else 0.2)


def _flat_cos(t: float) -> float:
    return 1.0 if t <= 0.5 else 0.5 * (1.0 + math.cos(math.pi * (2.0 * t - 1.0)))


def _coslog4(t: float) -> float:
    return 0.5 * (1.0 - math.cos(2 * math.pi * math.log2(1.0 + 15.0 * t)))


@functools.cache
def _parts() -> tuple[Any, type]:
    """(a parameter carrying its learning-rate and weight-decay factors, the NTK-parametrized layer)."""
    import torch
    from torch import nn

    def param(data: torch.Tensor, lr_factor: float = 1.0, wd_factor: float = 1.0) -> nn.Parameter:
        p = nn.Parameter(data)
        p.lr_factor, p.wd_factor = lr_factor, wd_factor  # the optimizer's parameter groups (optimizer below)
        return p

    class Layer(nn.Module):
        """NTK-parametrized linear layer (weight / sqrt(fan-in)) and its bias (learning rate x0.1, no decay)."""

        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__()
            self.weight = param(torch.randn(n_in, n_out))
            self.bias = param(torch.zeros(n_out), 0.1, 0.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ (self.weight / math.sqrt(self.weight.shape[0])) + self.bias

    return param, Layer


def _robust_scaling(network, x) -> None:
    """The network's input scaling from a first training batch x: the median and 1 / interquartile range of each
    input (half the range where the quartiles meet; 1 where the batch holds one value: a column constant here need
    not be constant everywhere)."""
    import torch

    with torch.no_grad():
        x = x[:SCALING_ROWS].float()  # torch.quantile takes at most 16M values
        q = torch.quantile(x, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], device=x.device), dim=0)
        spread = torch.where(q[3] > q[1], q[3] - q[1], 0.5 * (q[4] - q[0]))
        network.median.copy_(q[2])
        network.scale.copy_(torch.where(spread > 0, 1.0 / spread.clamp_min(1e-30), torch.ones_like(spread)))
        network.initialized.fill_(1)


@functools.cache
def _network() -> type:
    """The network's class, defined once torch is wanted."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    param, Layer = _parts()

    class RealMLP(nn.Module):
        """Packed features -> logits (classification) or the standardized value (regression)."""

        def __init__(self, prep, p: RealMLPParams) -> None:
            super().__init__()
            classification = prep.task == "classification"
            slots = prep.embedding_slots()
            codes = {pos for pos, _, _ in slots}
            continuous = [i for i in prep.continuous_positions() if i not in codes]
            dense = [i for i in range(prep.num_features) if i not in codes]
            self.register_buffer("dense_idx", torch.tensor(dense, dtype=torch.long))
            # the continuous values among the dense inputs (those PBLD embeds)
            self.register_buffer("num_idx", torch.tensor([dense.index(i) for i in continuous], dtype=torch.long))
            self.register_buffer("code_idx", torch.tensor([pos for pos, _, _ in slots], dtype=torch.long))
            # robust scaling of the dense inputs: set from the first training batch (initialized: 0 until then)
            self.register_buffer("median", torch.zeros(len(dense)))
            self.register_buffer("scale", torch.ones(len(dense)))
            self.register_buffer("initialized", torch.zeros((), dtype=torch.long))
            self.ready = False
            n_num = len(continuous)
            self.w1 = param(p.plr_sigma * torch.randn(n_num, PBLD_FREQUENCIES), 0.1, 0.1)
            self.b1 = param(math.pi * (2 * torch.rand(n_num, PBLD_FREQUENCIES) - 1), 0.1, 0.1)
            self.w2 = param(
                (2 * torch.rand(n_num, PBLD_FREQUENCIES, PBLD_OUT) - 1) / math.sqrt(PBLD_FREQUENCIES), 0.1, 0.1
            )
            self.b2 = param((2 * torch.rand(n_num, PBLD_OUT) - 1) / math.sqrt(PBLD_FREQUENCIES), 0.1, 0.1)
            self.embeddings = nn.ModuleList(nn.Embedding(n, p.embedding_size) for _, n, _ in slots)
            for emb in self.embeddings:
                emb.weight.lr_factor, emb.weight.wd_factor = 1.0, 1.0
            width = len(dense) + n_num * PBLD_OUT + len(slots) * p.embedding_size
            self.front = param(torch.ones(width), 6.0, 6.0)  # a learned scale per input
            act = p.act if p.act != "auto" else ("selu" if classification else "mish")
            self.act = getattr(F, act)
            sizes = [width] + [p.hidden_width] * p.n_hidden_layers
            self.layers = nn.ModuleList(Layer(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
            # parametric activations: x + a * (f(x) - x), a starting at 1 (learning rate and decay x0.1)
            self.mix = nn.ParameterList(param(torch.ones(b), 0.1, 0.1) for b in sizes[1:])
            self.dropout = nn.Dropout(p.p_drop)
            self.head = Layer(sizes[-1], prep.num_outputs)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            dense = x.index_select(1, self.dense_idx)
            if self.training and not self.ready:  # the buffer asked once per process, not at every step
                if not bool(self.initialized):
                    _robust_scaling(self, dense)
                self.ready = True
            dense = (dense - self.median) * self.scale
            dense = dense / (1 + dense.square() / 9).sqrt()  # smooth clipping to (-3, 3)
            parts = [dense]
            if self.w1.shape[0]:
                z = dense.index_select(1, self.num_idx).unsqueeze(-1)  # [rows, n_num, 1]
                z = torch.cos(2 * math.pi * z * self.w1 + self.b1)  # [rows, n_num, frequencies]
                parts.append((torch.einsum("rnf,nfo->rno", z, self.w2) + self.b2).flatten(1))
            if len(self.embeddings):
                codes = x.index_select(1, self.code_idx).long()
                parts += [emb(codes[:, i]) for i, emb in enumerate(self.embeddings)]
            h = torch.cat(parts, dim=1) * self.front
            for layer, mix in zip(self.layers, self.mix):
                h = layer(h)
                h = self.dropout(h + mix * (self.act(h) - h))
            return self.head(h)

    return RealMLP


@functools.cache
def _schedule() -> type:
    """The schedule's class, defined once torch is wanted."""
    import torch

    class Schedule(torch.optim.lr_scheduler.LambdaLR):
        """coslog4 for the learning rate (each group's peak: lr x its factor); flat-cos for the weight decay and the
        dropout; stepped once per optimizer step."""

        def __init__(self, optimizer, total_steps: int, wd: float, dropouts: list, p_drop: float) -> None:
            self.total_steps, self.wd, self.p_drop = max(1, total_steps), wd, p_drop
            self._dropouts = dropouts
            super().__init__(optimizer, lambda step: _coslog4(min(1.0, step / self.total_steps)))

        def step(self) -> None:  # type: ignore[override]
            super().step()
            t = min(1.0, self.last_epoch / self.total_steps)
            for group in self.optimizer.param_groups:
                group["weight_decay"] = self.wd * group["wd_factor"] * _flat_cos(t)
            for dropout in self._dropouts:
                dropout.p = self.p_drop * _flat_cos(t)

        def state_dict(self) -> dict[str, Any]:
            return {k: v for k, v in super().state_dict().items() if k != "_dropouts"}

    return Schedule


def build(prep, model_cfg: dict[str, Any]):
    return _network()(prep, settings(model_cfg))


def train_section(config):
    """What RealMLP's loop trains with: its own epochs, batch size, learning rate, weight decay, label smoothing and
    early stopping (model.params.realmlp), and train.class_weight."""
    p = settings(config.model.model_dump(mode="json"))
    classification = config.task == "classification"
    stopping = config.train.early_stopping.model_copy(update={"patience": p.patience})
    return _torch.NetworkTrain(
        epochs=p.n_epochs,
        batch_size=p.batch_size,
        learning_rate=_peak_lr(p, classification),
        weight_decay=p.wd,
        label_smoothing=p.ls_eps if classification else 0.0,
        early_stopping=stopping,
        class_weight=config.train.class_weight,
    )


def optimizer(model, train_cfg, total_steps: int) -> tuple[Any, Any]:
    """AdamW with betas (0.9, 0.95) and one parameter group per (learning-rate, weight-decay) factor, and its
    schedule."""
    import torch

    from trainflow.trainer.budget import fusable

    schedule = _schedule()
    groups: dict[tuple[float, float], list] = {}
    for p in model.parameters():
        groups.setdefault((getattr(p, "lr_factor", 1.0), getattr(p, "wd_factor", 1.0)), []).append(p)
    optimizer = torch.optim.AdamW(
        [
            {"params": ps, "lr": train_cfg.learning_rate * lr_f, "wd_factor": wd_f, "weight_decay": 0.0}
            for (lr_f, wd_f), ps in groups.items()
        ],
        lr=train_cfg.learning_rate,
        betas=(0.9, 0.95),
        fused=fusable(model.parameters()),
    )
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    p_drop = dropouts[0].p if dropouts else 0.0
    return optimizer, schedule(optimizer, total_steps, train_cfg.weight_decay, dropouts, p_drop)


def _hashed(model: dict[str, Any]) -> dict[str, Any]:
    """Its epochs and patience only extend or stop a run (as model.params.mlp.epochs does the network's): a resume may
    change them."""
    params = {k: v for k, v in (model.get("params") or {}).items() if k not in ("n_epochs", "patience")}
    return {**model, "params": params}


def _describe(model: dict[str, Any]) -> str:
    p = settings(model)
    return (
        f"RealMLP-TD: {p.n_hidden_layers} x {p.hidden_width} units, {p.act} activations, PBLD embeddings, lr {p.lr} "
        f"(coslog4), weight decay {p.wd}, dropout {p.p_drop}, label smoothing {p.ls_eps}, {p.n_epochs} epochs of "
        f"{p.batch_size}"
    )


FAMILY = _torch.torch_family(
    NAME,
    build=build,
    train_section=train_section,
    optimizer=optimizer,
    describe=_describe,
    hashed=_hashed,
    params=RealMLPParams,
    search_space={
        "model.params.lr": {"loguniform": [0.01, 0.3]},
        "model.params.wd": {"choice": [0.0, 0.02]},
        "model.params.p_drop": {"choice": [0.0, 0.15, 0.3]},
    },
    # auto with train.time_limit in seconds trains it in the network's place (docs/families.md: ahead of auto on the
    # four tables measured, at 1.3-3x its time); a default run's cost targets leave it out otherwise. Last in both
    # orders: the slowest family takes what the boosters leave (second on one split, its epochs took diamonds' 180 s
    # and LightGBM had time for one round, RMSE 544; last, every family trained, 545)
    auto_rank=(3, 4),
    auto_when="timed",
    listed=7,
)
