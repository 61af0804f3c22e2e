"""The model: a plain MLP over the packed feature tensor."""

from __future__ import annotations

from torch import nn


def build_model(input_dim: int, output_dim: int, hidden_sizes: list[int], dropout: float) -> nn.Sequential:
    """An MLP: [Linear -> ReLU -> Dropout] per hidden size, then a Linear head."""
    layers: list[nn.Module] = []
    width = input_dim
    for h in hidden_sizes:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, output_dim))
    return nn.Sequential(*layers)
