"""The model: an MLP over the packed feature tensor, with entity embeddings for high-cardinality text columns."""

from __future__ import annotations

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


class EmbeddingMLP(nn.Module):
    """Looks up the integer codes at the embedded positions, then runs the MLP over [dense values, embeddings]."""

    def __init__(self, input_dim: int, output_dim: int, hidden_sizes: list[int], dropout: float,
                 slots: Sequence[tuple[int, int, int]]):
        super().__init__()
        codes = [pos for pos, _, _ in slots]
        self.register_buffer("code_idx", torch.tensor(codes, dtype=torch.long), persistent=False)
        self.register_buffer(
            "dense_idx", torch.tensor([i for i in range(input_dim) if i not in set(codes)], dtype=torch.long), persistent=False
        )
        self.embeddings = nn.ModuleList(nn.Embedding(n, dim) for _, n, dim in slots)
        self.mlp = mlp(len(self.dense_idx) + sum(dim for _, _, dim in slots), output_dim, hidden_sizes, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes = x.index_select(1, self.code_idx).long()
        parts = [x.index_select(1, self.dense_idx)] + [emb(codes[:, i]) for i, emb in enumerate(self.embeddings)]
        return self.mlp(torch.cat(parts, dim=1))


def build_model(
    input_dim: int, output_dim: int, hidden_sizes: list[int], dropout: float,
    embeddings: Sequence[tuple[int, int, int]] = (),
) -> nn.Module:
    """The plain MLP, or an EmbeddingMLP when the preprocessor embeds some columns ((position, codes, width) each)."""
    if not embeddings:
        return mlp(input_dim, output_dim, hidden_sizes, dropout)
    return EmbeddingMLP(input_dim, output_dim, hidden_sizes, dropout, embeddings)


def model_for(prep, model_cfg: dict) -> nn.Module:
    """The network for a fitted preprocessor (its packed width, outputs and embedded columns) and the model config."""
    return build_model(prep.num_features, prep.num_outputs, model_cfg["hidden_sizes"], model_cfg["dropout"],
                       prep.embedding_slots())
