"""Benchmark: one training step (forward, loss, backward, SGD update) of a small CNN.

Each recorded iteration is a whole step, so a slower backward kernel, an
extra host-device copy or a lost Tensor Core path all show up in the
step's time and, per op, in the report's op table.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402


def small_cnn(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, classes),
    )


@pytest.mark.gpuprofile(iterations=20, warmup=3)
def test_cnn_train_step(gpuprofile, device):
    model = small_cnn().to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(16, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (16,), device=device)
    losses = []
    for _ in gpuprofile.iterations():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    assert losses[-1].item() < losses[0].item()  # it does learn the fixed batch
