"""A Llama's training step and inference forward under perfguard (``models.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import models  # noqa: E402

S = models.SIZE


@pytest.mark.gpuprofile(iterations=S.iterations, warmup=S.warmup, tolerance="5%")
def test_lm_train_step(gpuprofile, device):
    step = models.lm_train_step(device)
    losses = [step() for _ in gpuprofile.iterations()]
    assert torch.isfinite(torch.stack(losses)).all()


@pytest.mark.gpuprofile(iterations=2 * S.iterations, warmup=S.warmup, tolerance="5%")
def test_lm_forward(gpuprofile, device):
    step = models.lm_forward_step(device)
    for _ in gpuprofile.iterations():
        logits = step()
    assert logits.shape == (S.batch, S.seq, S.vocab)
