"""Benchmark: forward pass of one pre-norm transformer block (attention + MLP).

``gpuprofile.iterations()`` yields the warm-up steps first, then the
recorded ones; with ``pytest --perfguard`` each recorded step is captured
and compared with the baseline of the PR's base commit. Without
``--perfguard`` the loop just runs, so this is also an ordinary test.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, d_model: int = 128, heads: int = 4, hidden: int = 512) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


@pytest.mark.gpuprofile(iterations=20, warmup=3, tolerance="5%")
def test_transformer_block_forward(gpuprofile, device):
    model = Block().to(device).eval()
    x = torch.randn(8, 64, 128, device=device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # Tensor Cores on a GPU
    with torch.inference_mode(), torch.autocast(device, dtype=dtype, enabled=device == "cuda"):
        for _ in gpuprofile.iterations():
            y = model(x)
    assert y.shape == x.shape and torch.isfinite(y.float()).all()
