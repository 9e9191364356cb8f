"""Five small CPU models of different kinds, for A/B sensitivity (issue 34).

Each model is a training step whose per-process timing offset behaves
differently: dense matmuls (MLP stack), a convolution with batch norm and a
residual (conv block), softmax attention with LayerNorm (attention block),
an embedding lookup with LayerNorm (embedding + LayerNorm) and a step of
many tiny ops driven by Python (a GRU cell unrolled in a Python loop).

``SOURCE`` is a module's text: the calibration writes it into its test
project as ``models.py`` (so each tree imports its own copy) and
``ab_offsets.py`` executes it in-process. ``python_work(units)`` is the
injected slowdown: pure-Python arithmetic, no torch op, so no counter moves
and only timing can see it.
"""

from __future__ import annotations

from typing import Any

NAMES = ("mlp", "conv", "attention", "embed_ln", "python_loop")

SOURCE = '''"""Five small CPU training steps (perfguard benchmarks/ab_models.py)."""

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)


def python_work(units):
    """Pure-Python arithmetic (about 1 us a unit): a slowdown no op counter sees."""
    acc = 0
    for i in range(units * 40):
        acc += i * i
    return acc


def _step(model, opt, inputs, target, loss_fn):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        opt.step()
        return loss

    return step


def build_mlp(seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(256, 10))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return _step(model, opt, (x,), y, F.cross_entropy)


class ConvBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(h)))


def build_conv(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(ConvBlock(16), ConvBlock(16), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))
    x, y = torch.randn(8, 16, 16, 16), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return _step(model, opt, (x,), y, F.cross_entropy)


class AttentionBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def build_attention(seed=0):
    torch.manual_seed(seed)
    model = AttentionBlock(64, 4)
    x = torch.randn(4, 32, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return _step(model, opt, (x,), x, F.mse_loss)


class EmbedLN(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.ln(self.emb(tokens))).flatten(0, 1)


def build_embed_ln(seed=0):
    torch.manual_seed(seed)
    model = EmbedLN(1000, 64)
    tokens = torch.randint(0, 1000, (8, 32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return _step(model, opt, (tokens,), tokens.flatten(), F.cross_entropy)


class LoopGRU(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.cell = nn.GRUCell(d, d)
        self.out = nn.Linear(d, 1)

    def forward(self, xs):
        h = torch.zeros(xs.shape[1], xs.shape[2])
        for x in xs:  # one Python iteration per time step: many tiny ops
            h = self.cell(x, h)
        return self.out(h).squeeze(-1)


def build_python_loop(seed=0):
    torch.manual_seed(seed)
    model = LoopGRU(16)
    xs, y = torch.randn(24, 4, 16), torch.randn(4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return _step(model, opt, (xs,), y, F.mse_loss)


BUILDERS = {
    "mlp": build_mlp,
    "conv": build_conv,
    "attention": build_attention,
    "embed_ln": build_embed_ln,
    "python_loop": build_python_loop,
}
'''


def load() -> dict[str, Any]:
    """The models module's namespace, executed in this process."""
    namespace: dict[str, Any] = {"__name__": "perfguard_ab_models"}
    exec(compile(SOURCE, "ab_models.SOURCE", "exec"), namespace)
    return namespace
