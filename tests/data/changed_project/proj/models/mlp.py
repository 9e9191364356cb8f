"""A multilayer perceptron sized by configs/mlp.json."""

import torch
from torch import nn

from proj.config import load


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        hidden = load("configs/mlp.json")["hidden"]
        self.fc1 = nn.Linear(32, hidden)
        self.fc2 = nn.Linear(hidden, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))
