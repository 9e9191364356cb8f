"""A two-layer convolutional block."""

import torch
from torch import nn

from proj.layers.helpers import act

CHANNELS = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.conv2 = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return act(self.conv2(act(self.conv1(x))))
