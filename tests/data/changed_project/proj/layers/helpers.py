"""Helpers every convolutional and attention model shares."""

import torch


def act(x: torch.Tensor) -> torch.Tensor:
    # the activation of every block
    return torch.relu(x)
