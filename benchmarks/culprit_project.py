"""The project ``culprits.py`` regresses: small real torch models and their benchmark tests.

Kept apart from the driver so the models read as a project's code: each regression in
``culprits.py`` is a textual edit of these files (an exact ``old`` -> ``new``
replacement), the diff a pull request would make.

A module of helpers the models and tests share (so code can move between modules). Six
tests, each on its own model, all on the CPU with one thread and tiny sizes so a
session is seconds: causal self-attention (SDPA), an MLP block (LayerNorm, GELU), an
attention-pooling classifier (explicit softmax, a padding mask, bmm), a small conv net,
an MLP classifier's training step, and a 2-layer GPT's training step.
"""

from __future__ import annotations

MODELS = '''"""Small models: the code under benchmark."""

import torch
from torch import nn
from torch.nn import functional as F

import helpers

torch.set_num_threads(1)

B, T, D, HEADS, VOCAB = 2, 16, 32, 4, 64


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through the fused SDPA op."""

    def __init__(self, d=D, heads=HEADS):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class MLPBlock(nn.Module):
    """Pre-norm MLP with a residual: LayerNorm, Linear, GELU (tanh), Linear."""

    def __init__(self, d=D, hidden=4 * D):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        h = self.norm(x)
        h = self.up(h)
        h = helpers.gelu(h)
        return x + self.down(h)


class AttentionPool(nn.Module):
    """Scores each token, masks the padding, softmax over tokens, weighted sum, classify."""

    def __init__(self, d=D, classes=10):
        super().__init__()
        self.score = nn.Linear(d, 1)
        self.head = nn.Linear(d, classes)

    def forward(self, x, mask):
        scores = self.score(x).squeeze(-1)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = F.softmax(scores, dim=1)
        pooled = torch.bmm(weights.unsqueeze(1), x).squeeze(1)
        return self.head(pooled)


def padding_mask(lengths, t=T):
    """True where a token is real (built once per batch by the data pipeline)."""
    return torch.arange(t)[None, :] < lengths[:, None]


class ConvNet(nn.Module):
    """Two conv layers with batch norm, pooling and a linear head."""

    def __init__(self, channels=8, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc = nn.Linear(2 * channels, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class Classifier(nn.Module):
    """An MLP classifier (trained in the benchmark)."""

    def __init__(self, d_in=64, hidden=128, classes=10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    """A GPT block: attention and MLP, each pre-norm with a residual."""

    def __init__(self, d=D):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d)
        self.mlp = MLPBlock(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return self.mlp(x)


class TinyGPT(nn.Module):
    """Token and position embeddings, N_LAYER blocks, a final norm and the LM head."""

    N_LAYER = 2

    def __init__(self, vocab=VOCAB, d=D, t=T):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(t, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(self.N_LAYER))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
'''

HELPERS = '''"""Helpers the models and the benchmarks share."""

from torch.nn import functional as F

#: the latest value of each metric (a dashboard reads it)
METRICS = {}


def log_metric(name, value):
    """Keep the latest value of a metric, still on its device."""
    METRICS[name] = value.detach()
    return value


def gelu(h):
    """The models' activation."""
    return F.gelu(h, approximate="tanh")
'''

TESTS = '''"""Benchmark tests: one per model, each a loop of real steps."""

import pytest
import torch
from torch.nn import functional as F

import helpers
import models

ROUNDS = dict(iterations={iterations}, rounds={rounds}, warmup={warmup})


def _seed():
    torch.manual_seed(0)


@pytest.mark.gpuprofile(**ROUNDS)
def test_attention(gpuprofile):
    _seed()
    model = models.CausalSelfAttention().eval()
    x = torch.randn(models.B, models.T, models.D)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            y = model(x)
    assert y.shape == x.shape


@pytest.mark.gpuprofile(**ROUNDS)
def test_mlp_block(gpuprofile):
    _seed()
    model = models.MLPBlock().eval()
    x = torch.randn(models.B, models.T, models.D)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            y = model(x)
    assert y.shape == x.shape


@pytest.mark.gpuprofile(**ROUNDS)
def test_attention_pool(gpuprofile):
    _seed()
    model = models.AttentionPool().eval()
    x = torch.randn(models.B, models.T, models.D)
    lengths = torch.tensor([models.T, models.T // 2])
    mask = models.padding_mask(lengths)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            logits = model(x, mask)
    assert logits.shape == (models.B, 10)


@pytest.mark.gpuprofile(**ROUNDS)
def test_convnet(gpuprofile):
    _seed()
    model = models.ConvNet().eval()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        for _ in gpuprofile.iterations():
            logits = model(x)
    assert logits.shape == (4, 10)


@pytest.mark.gpuprofile(**ROUNDS)
def test_classifier_train_step(gpuprofile):
    _seed()
    model = models.Classifier()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))
    for _ in gpuprofile.iterations():
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        helpers.log_metric("loss", loss)
    assert torch.isfinite(loss)


@pytest.mark.gpuprofile(**ROUNDS)
def test_gpt_train_step(gpuprofile):
    _seed()
    model = models.TinyGPT()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    idx = torch.randint(0, models.VOCAB, (models.B, models.T))
    target = torch.roll(idx, -1, dims=1)
    for _ in gpuprofile.iterations():
        opt.zero_grad(set_to_none=True)
        logits = model(idx)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
'''

TESTS_FILE = "test_bench.py"
MODELS_FILE = "models.py"
HELPERS_FILE = "helpers.py"


def files(iterations: int, rounds: int, warmup: int) -> dict[str, str]:
    """The base commit's files (the marker's sizes are the driver's to pick)."""
    return {
        MODELS_FILE: MODELS,
        HELPERS_FILE: HELPERS,
        TESTS_FILE: TESTS.format(iterations=iterations, rounds=rounds, warmup=warmup),
        "pytest.ini": "[pytest]\naddopts = -p no:cacheprovider\n",
        ".gitignore": ".perfguard/\n__pycache__/\nbaselines/\n",
    }
