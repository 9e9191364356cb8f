"""Single-head self-attention with a pre-norm."""

import torch
from torch import nn

from proj.layers.helpers import act
from proj.layers.norm import layer_norm


class Attention(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(layer_norm(x)).chunk(3, dim=-1)
        w = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return act(self.out(w @ v))
