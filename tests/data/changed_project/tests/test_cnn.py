import pytest
import torch
from proj.models.cnn import Block


@pytest.mark.gpuprofile(iterations=3, warmup=1)
@pytest.mark.parametrize("batch", [1, 2])
def test_cnn(gpuprofile, batch):
    model, x = Block(), torch.randn(batch, 3, 16, 16)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            model(x)
