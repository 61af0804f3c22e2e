"""The model: an MLP over the packed feature tensor, with entity embeddings for high-cardinality text columns,
or a user's own nn.Module found by its import path."""

from __future__ import annotations

import importlib
import inspect
import math
import os
from collections.abc import Sequence

import torch
from torch import nn


def mlp(input_dim: int, output_dim: int, hidden_sizes: list[int], dropout: float) -> nn.Sequential:
    """[Linear -> ReLU -> Dropout] per hidden size, then a Linear head."""
    layers: list[nn.Module] = []
    width = input_dim
    for h in hidden_sizes:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, output_dim))
    return nn.Sequential(*layers)


PERIODIC_DIM = 16  # width of each continuous value's periodic embedding (model.numeric_embedding: periodic)
PERIODIC_FREQUENCIES = 48  # its learned frequencies (sin and cos of each feed a linear layer to PERIODIC_DIM)
# numeric_embedding auto: periodic up to this many training rows; above, the plain values (a step costs about 3x with
# periodic embeddings of 16 columns, and large tables' epochs are what a run's time is made of)
PERIODIC_MAX_ROWS = 1_000_000


def uses_periodic(prep, model_cfg: dict) -> bool:
    """Whether the network embeds its continuous values periodically (decided from the fitted preprocessor, so the
    checkpoint's network is rebuilt the same way when it is served)."""
    mode = model_cfg.get("numeric_embedding", "none")
    return mode == "periodic" or (mode == "auto" and prep.train_rows <= PERIODIC_MAX_ROWS)


class TabMHead(nn.Module):
    """TabM's ensemble (Gorishniy et al., 2024, the `tabm` package): k MLPs of `n_blocks` layers of width `d_block`
    that share their weights and differ by BatchEnsemble's per-member scalings, trained in parallel on the same rows.

    Training returns every member's output, [rows, k, outputs] (the loss is each member's, averaged); evaluation
    returns the ensemble's: the log of the members' mean class probabilities (logits for softmax, so calibration and
    serving read it as any network's), or the mean value for regression."""

    def __init__(
        self,
        width: int,
        output_dim: int,
        k: int,
        n_blocks: int,
        d_block: int,
        dropout: float,
        chunks: Sequence[int],
        classification: bool,
    ):
        super().__init__()
        from tabm import EnsembleView, LinearEnsemble, make_tabm_backbone

        self.k, self.classification = k, classification
        self.view = EnsembleView(k=k)
        # the first scaling's initialization per feature chunk: random signs over plain values, normal over embeddings
        self.backbone = make_tabm_backbone(
            d_in=width,
            n_blocks=n_blocks,
            d_block=d_block,
            dropout=dropout,
            k=k,
            arch_type="tabm",
            start_scaling_init="normal" if any(c > 1 for c in chunks) else "random-signs",
            start_scaling_init_chunks=list(chunks),
        )
        self.output = LinearEnsemble(d_block, output_dim, k=k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.output(self.backbone(self.view(x)))
        if self.training:
            return out
        if self.classification:
            return torch.logsumexp(out.log_softmax(-1), dim=1) - math.log(self.k)
        return out.mean(1)


def head(width: int, output_dim: int, model_cfg: dict, chunks: Sequence[int], classification: bool) -> nn.Module:
    """The layers over the features' representation: trainflow's MLP, or TabM's ensemble (model.architecture)."""
    if model_cfg.get("architecture", "mlp") == "tabm":
        sizes = model_cfg["hidden_sizes"]
        return TabMHead(
            width, output_dim, model_cfg["tabm_k"], len(sizes), max(sizes), model_cfg["dropout"], chunks, classification
        )
    return mlp(width, output_dim, model_cfg["hidden_sizes"], model_cfg["dropout"])


def _embedding(codes: int, dim: int, initialize: bool) -> nn.Embedding:
    """nn.Embedding(codes, dim), or with its weight left uninitialized (a count on the meta device: the meta kernel of
    the normal_ its initialization calls imports about 800 modules, sympy's among them, 1-3 s of a retrain)."""
    if initialize:
        return nn.Embedding(codes, dim)
    return nn.Embedding.from_pretrained(torch.empty(codes, dim), freeze=False)


class EmbeddingMLP(nn.Module):
    """Looks up the integer codes at the embedded positions, and with `periodic` maps each continuous value through
    rtdl_num_embeddings' periodic embedding (PLR: learned frequencies, sin and cos, a linear layer and ReLU; Gorishniy
    et al., 2022), then runs the layers (`head`) over [the other values, code embeddings, periodic embeddings]."""

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        model_cfg: dict,
        slots: Sequence[tuple[int, int, int]],
        periodic: Sequence[int] = (),
        classification: bool = True,
        initialize: bool = True,
    ):
        super().__init__()
        codes = [pos for pos, _, _ in slots]
        taken = set(codes) | set(periodic)
        self.register_buffer("code_idx", torch.tensor(codes, dtype=torch.long), persistent=False)
        self.register_buffer("num_idx", torch.tensor(list(periodic), dtype=torch.long), persistent=False)
        self.register_buffer(
            "dense_idx",
            torch.tensor([i for i in range(input_dim) if i not in taken], dtype=torch.long),
            persistent=False,
        )
        self.embeddings = nn.ModuleList(_embedding(n, dim, initialize) for _, n, dim in slots)
        self.periodic = None
        if periodic:
            from rtdl_num_embeddings import PeriodicEmbeddings

            self.periodic = PeriodicEmbeddings(
                len(periodic), PERIODIC_DIM, n_frequencies=PERIODIC_FREQUENCIES, lite=False
            )
        chunks = [1] * len(self.dense_idx) + [dim for _, _, dim in slots] + [PERIODIC_DIM] * len(periodic)
        self.mlp = head(sum(chunks), output_dim, model_cfg, chunks, classification)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes = x.index_select(1, self.code_idx).long()
        parts = [x.index_select(1, self.dense_idx)] + [emb(codes[:, i]) for i, emb in enumerate(self.embeddings)]
        if self.periodic is not None:
            parts.append(self.periodic(x.index_select(1, self.num_idx)).flatten(1))
        return self.mlp(torch.cat(parts, dim=1))


def build_model(
    input_dim: int,
    output_dim: int,
    model_cfg: dict,
    embeddings: Sequence[tuple[int, int, int]] = (),
    periodic: Sequence[int] = (),
    classification: bool = True,
    initialize: bool = True,
) -> nn.Module:
    """The plain MLP, or an EmbeddingMLP when the preprocessor embeds some columns ((position, codes, width) each),
    continuous values get periodic embeddings (their positions) or the layers are TabM's. initialize=False: the
    embeddings' weights are left uninitialized (a count of the parameters)."""
    if not embeddings and not periodic and model_cfg.get("architecture", "mlp") == "mlp":
        return mlp(input_dim, output_dim, model_cfg["hidden_sizes"], model_cfg["dropout"])
    return EmbeddingMLP(input_dim, output_dim, model_cfg, embeddings, periodic, classification, initialize)


def import_class(class_path: str) -> type:
    """'package.module:ClassName' (or 'package.module.ClassName') -> the class; ValueError naming what failed."""
    module_name, sep, name = class_path.partition(":")
    if not sep:
        module_name, _, name = class_path.rpartition(".")
    if not module_name or not name:
        raise ValueError(f"model.class_path {class_path!r}: expected 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model.class_path {class_path!r}: cannot import module {module_name!r} ({exc})") from None
    cls = getattr(module, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
        raise ValueError(
            f"model.class_path {class_path!r}: {module_name} has no torch.nn.Module subclass named {name!r}"
        )
    return cls


def user_class_path(model_cfg: dict) -> str | None:
    """The nn.Module class a model config makes model_for import: a user's module (model.type torch), else None
    (trainflow's own network; the boosters import no user code)."""
    return model_cfg.get("class_path") if model_cfg.get("type", "mlp") == "torch" else None


# a network trains with its weights, gradients and two AdamW moments: about four copies of its float32 parameters
TRAINING_COPIES = 4


def network_parameters(prep, model_cfg: dict) -> int | None:
    """How many parameters trainflow's network has for this preprocessor and config, counted on PyTorch's meta
    device before anything is allocated (None for a user's module, which only its constructor knows)."""
    if user_class_path(model_cfg):
        return None
    with torch.device("meta"):
        if model_cfg.get("type", "mlp") != "mlp":  # another torch family's network, as it builds it
            return sum(p.numel() for p in built(prep, model_cfg).parameters())
        return sum(p.numel() for p in model_for(prep, model_cfg, initialize=False).parameters())


def available_memory_bytes() -> int:
    """The memory this process can still take (MemAvailable), or the machine's total where that is not readable."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _layers(model_cfg: dict) -> str:
    """The keys that size a torch family's layers, as its config spells them."""
    family = model_cfg.get("type", "mlp")
    if "hidden_sizes" in model_cfg:  # trainflow's network: model.hidden_sizes (model.params.mlp.hidden_sizes)
        return f"model.hidden_sizes {model_cfg['hidden_sizes']}"
    params = model_cfg.get("params") or {}
    sizing = {k: v for k, v in params.items() if k.startswith(("hidden", "n_hidden")) and v is not None}
    return f"model.params.{family} {sizing}"


def check_network_size(prep, model_cfg: dict, limit_bytes: int, what: str) -> None:
    """ValueError naming the sizes when the network's float32 parameters (times copies) would exceed limit_bytes."""
    params = network_parameters(prep, model_cfg)
    if params is None:
        return
    if params * 4 > limit_bytes:
        raise ValueError(
            f"{_layers(model_cfg)} with {prep.num_features} packed features and embeddings "
            f"{[(codes, dim) for _, codes, dim in prep.embedding_slots()]} make a network of {params:,} parameters "
            f"({params * 4 / 2**30:.2f} GiB as float32), more than {what} ({limit_bytes / 2**30:.2f} GiB); nothing "
            "was allocated. Choose smaller hidden sizes"
        )


def model_for(prep, model_cfg: dict, initialize: bool = True) -> nn.Module:
    """The network for a fitted preprocessor (its packed width, outputs and embedded columns) and the model config.

    A user's module (model.type torch) is built as Class(in_features, out_features, **init_args), plus
    embeddings=[(position, codes, width), ...] when its constructor takes that argument. initialize=False: trainflow's
    network with its embeddings' weights uninitialized (network_parameters' count on the meta device).
    """
    class_path = user_class_path(model_cfg)
    if class_path:
        cls = import_class(class_path)
        kwargs = dict(model_cfg.get("init_args") or {})
        if "embeddings" in inspect.signature(cls).parameters:
            kwargs["embeddings"] = prep.embedding_slots()
        return cls(prep.num_features, prep.num_outputs, **kwargs)
    periodic = prep.continuous_positions() if uses_periodic(prep, model_cfg) else ()
    return build_model(
        prep.num_features,
        prep.num_outputs,
        model_cfg,
        prep.embedding_slots(),
        periodic,
        prep.task == "classification",
        initialize,
    )


def built(prep, model_cfg: dict):
    """The network of the torch family model_cfg names (its type; unnamed: trainflow's network), built by it."""
    from trainflow.trainer.families import UNNAMED, family_named

    family = family_named(model_cfg.get("type", UNNAMED), "config.json model.type")
    if family.build is None:
        raise ValueError(f"model.type {family.name!r}: not a family the torch loop trains (it builds no network)")
    return family.build(prep, model_cfg)


def check_model(prep, model_cfg: dict) -> None:
    """Before any training: the model builds with the fitted widths and maps a batch to [rows, outputs].

    Raises ValueError naming the class path and what is wrong.
    """
    where = model_cfg.get("class_path") or {"mlp": "trainflow's MLP"}.get(
        model_cfg.get("type", "mlp"), model_cfg["type"]
    )
    check_network_size(
        prep,
        model_cfg,
        available_memory_bytes() // TRAINING_COPIES,
        "a quarter of this machine's available memory (weights, gradients and optimizer state)",
    )
    if user_class_path(model_cfg):
        import_class(user_class_path(model_cfg))  # an import problem is named as such
    try:
        model = built(prep, model_cfg)
    except Exception as exc:  # noqa: BLE001 - a user's constructor can raise anything
        raise ValueError(
            f"model {where}: cannot be built with in_features={prep.num_features}, "
            f"out_features={prep.num_outputs} and init_args {model_cfg.get('init_args') or {}}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, prep.num_features))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(
            f"model {where}: forward on a batch of shape (2, {prep.num_features}) failed: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, prep.num_outputs):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"model {where}: a batch of 2 rows gave output {shape}; expected (2, {prep.num_outputs}) "
            f"({'one logit per class' if prep.task == 'classification' else 'one value per row'})"
        )
