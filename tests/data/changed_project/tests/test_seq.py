import pytest
import torch
from proj.layers.norm import rms_norm
from proj.models.rnn import Encoder


@pytest.mark.gpuprofile(iterations=3, warmup=1)
def test_rnn(gpuprofile):
    model, x = Encoder(), torch.randn(2, 8, 16)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            model(x)


@pytest.mark.gpuprofile(iterations=3, warmup=1)
def test_rms_norm(gpuprofile):
    x = torch.randn(8, 64)
    for _ in gpuprofile.iterations():
        rms_norm(x)


def test_plain():
    assert rms_norm(torch.ones(2, 4)).shape == (2, 4)
