"""The forecaster's layers in torch: the network `forecaster.build_forecaster` builds.

This module imports torch as it loads, so `forecaster` defers it through `LazyImport` until a
model is built: listing adapters and `plan` read `forecaster`'s memory model without torch. The
number of attention heads is `forecaster.HEADS`, passed in, so the memory model and the network
agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedResidualNetwork(nn.Module):
    """TFT's GRN: ELU MLP, dropout, GLU gate, residual, LayerNorm."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)
        self.gate = nn.Linear(width, 2 * width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(self.fc2(F.elu(self.fc1(x))))
        return self.norm(x + F.glu(self.gate(hidden)))


class FusionBlock(nn.Module):
    """Causal self-attention with a gated skip connection, then a GRN."""

    def __init__(self, width: int, dropout: float, heads: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.gate = nn.Linear(width, 2 * width)
        self.norm = nn.LayerNorm(width)
        self.grn = GatedResidualNetwork(width, dropout)
        self.dropout = dropout
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, window, width = x.shape
        q, k, v = self.qkv(x).view(batch, window, 3, self.heads, width // self.heads).unbind(2)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=True,
        )
        attended = self.out(attended.transpose(1, 2).reshape(batch, window, width))
        return self.grn(self.norm(x + F.glu(self.gate(attended))))


class Forecaster(nn.Module):
    """Window of returns -> the next `horizon` returns."""

    def __init__(
        self, width: int, window: int, depth: int, horizon: int, dropout: float, heads: int
    ) -> None:
        super().__init__()
        self.value = nn.Linear(1, width)
        self.position = nn.Parameter(torch.randn(window, width) * 0.02)
        self.encoder = GatedResidualNetwork(width, dropout)
        self.blocks = nn.ModuleList(FusionBlock(width, dropout, heads) for _ in range(depth))
        self.head = nn.Linear(width, horizon)

    def forward(self, returns: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.value(returns.unsqueeze(-1)) + self.position)
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, -1])  # the last step has seen the whole window
