import pytest
import torch
from proj.models.mlp import MLP


@pytest.mark.gpuprofile(iterations=3, warmup=1)
@pytest.mark.parametrize("batch", [4, 16])
def test_mlp(gpuprofile, batch):
    model, x = MLP(), torch.randn(batch, 32)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            model(x)
