"""A ResNet's training step in channels-last under perfguard (``models.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import models  # noqa: E402

S = models.SIZE


@pytest.mark.gpuprofile(iterations=S.iterations, warmup=S.warmup, tolerance="5%")
def test_cnn_train_step(gpuprofile, device):
    step = models.cnn_train_step(device)
    losses = [step() for _ in gpuprofile.iterations()]
    assert torch.isfinite(torch.stack(losses)).all()
