"""An example of your own network for trainflow: a residual MLP for tabular data.

Use it with

    model:
      type: torch
      params:
        torch:
          class_path: trainflow.examples.tabular_resnet:TabularResNet
          init_args: {width: 128, blocks: 2, dropout: 0.1}

trainflow imports the class on every Ray Train worker and in every process that loads the model, and
builds it as TabularResNet(in_features, out_features, **init_args). The input is trainflow's packed
float32 row; because the constructor takes `embeddings`, trainflow also passes the (position, number
of codes, width) of each high-cardinality text column, whose integer code sits at that position.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.body = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout), nn.Linear(width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class TabularResNet(nn.Module):
    """Embeds the code columns, projects everything to `width`, then `blocks` residual blocks and a head."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        width: int = 128,
        blocks: int = 2,
        dropout: float = 0.1,
        embeddings: list[tuple[int, int, int]] = (),
    ):
        super().__init__()
        code_cols = [pos for pos, _, _ in embeddings]
        self.register_buffer("codes", torch.tensor(code_cols, dtype=torch.long), persistent=False)
        self.register_buffer(
            "values",
            torch.tensor([i for i in range(in_features) if i not in code_cols], dtype=torch.long),
            persistent=False,
        )
        self.tables = nn.ModuleList(nn.Embedding(n, dim) for _, n, dim in embeddings)
        stem_in = len(self.values) + sum(dim for _, _, dim in embeddings)
        self.stem = nn.Linear(stem_in, width)
        self.blocks = nn.Sequential(*(ResidualBlock(width, dropout) for _ in range(blocks)))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        looked_up = [table(x[:, pos].long()) for table, pos in zip(self.tables, self.codes.tolist())]
        h = self.stem(torch.cat([x[:, self.values], *looked_up], dim=1))
        return self.head(self.blocks(h))
