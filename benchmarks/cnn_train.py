"""A small real training script: a conv net learning random CIFAR-sized images with SGD.

    python benchmarks/cnn_train.py [--steps N] [--batch B]

What ``perfguard profile --backend torch -- python benchmarks/cnn_train.py`` is measured
on (``benchmarks/profile_window.py``, ``tests/test_profile_window.py``): each step is
forward, loss, backward and ``optimizer.step()``, nothing marks iterations, so the
capture's window is found by the optimizer's step alone.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def conv_net(classes: int = 10) -> nn.Module:
    """Three conv blocks (conv, batch norm, ReLU; pooled after the second and third) and a
    linear head: about 15k parameters."""

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, 16),
        *block(16, 32),
        nn.MaxPool2d(2),
        *block(32, 32),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    torch.manual_seed(0)
    model = conv_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.batch, 3, 32, 32)
    labels = torch.randint(0, 10, (args.batch,))
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
    print(f"loss after {args.steps} steps: {loss.item():.4f}")


if __name__ == "__main__":
    main()
