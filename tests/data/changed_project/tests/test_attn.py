import pytest
import torch
from proj.models.attn import Attention

BATCH = 2


@pytest.mark.gpuprofile(iterations=3, warmup=1)
@pytest.mark.parametrize("tokens", [8, 16])
def test_attn(gpuprofile, tokens):
    model, x = Attention(), torch.randn(BATCH, tokens, 32)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            model(x)
