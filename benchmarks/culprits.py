"""Culprit benchmark: does the explanation name the op a regression actually changed?

Issue 27 asks that the first culprit named in ``summary.md`` and the failure message be
the right op in at least 95 % of realistic regressions, in store mode and A/B mode. This
script measures it on real sessions, end to end, the way a project meets perfguard:

* **The project** (``culprit_project.py``): a fresh git repository in a temp dir with six
  small real torch models on the CPU (causal self-attention through SDPA, an MLP block,
  an attention-pooling classifier, a conv net, an MLP classifier's training step and a
  2-layer GPT's training step), one ``@pytest.mark.gpuprofile`` test each. The base
  commit is saved as the baseline (``pytest --perfguard --perfguard-save``).
* **The regressions** (:data:`CASES`): each is an exact text edit of the base (the diff
  a pull request would make), committed on top of the base, with the op names a reviewer
  should be pointed to, written down *before* any result was seen. An op in the
  explanation is a path (``aten::linear/aten::addmm``, or under a ``record_function``
  range); the first culprit is *right* when any component of its path (autograd's
  ``evaluate_function:`` prefix dropped) is in the case's accepted set.
* **Sessions**: for each case, only the test the change touches, in a subprocess:
  store mode (``pytest --perfguard --perfguard-baseline=BASE``) and A/B mode
  (``--perfguard-against=BASE --perfguard-ab-pairs=P``, default 4 pairs to keep the time
  down). Each writes its own ``--perfguard-output`` folder; the script reads
  ``results.json`` (outcome, ``explanation.culprits[0]``, ``lead``), the failure
  message in pytest's stdout, the terminal table's row and ``summary.md``.
* **A/A**: a commit that only edits a comment, every test, ``--aa`` sessions per mode:
  any ``regressed``/``improved`` there is a false alarm.

``--project frameworks`` runs issue 50's catalogue instead (``framework_project.py``: a Keras
CNN in a custom ``tf.function`` loop, a Keras transformer trained by ``model.fit``, a JAX
MLP's jitted gradient step and a JAX attention block; :data:`FRAMEWORK_CASES`, eight changes
per framework), the A/A sessions over those four tests.

Outputs (``--out``, default ``benchmarks/out/culprits``): ``sessions.jsonl`` (one row per
session as it finishes), ``culprits.json`` (rows, rates, settings, load) and
``culprits.md`` (the table for ``benchmarks/README.md``).

Run::

    PYTHONPATH=. python benchmarks/culprits.py                  # every case, both modes
    PYTHONPATH=. python benchmarks/culprits.py --modes store --quick
    PYTHONPATH=. python benchmarks/culprits.py --cases softmax_f64,item_sync --keep

The child sessions import perfguard from this checkout (its root leads ``PYTHONPATH``);
the script checks that before it starts.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import culprit_project as project  # noqa: E402
import framework_project as frameworks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AUTOGRAD = "autograd::engine::evaluate_function: "
#: ops a Linear may run as, by the input's shape and the torch version
LINEAR = ("aten::linear", "aten::addmm", "aten::matmul", "aten::mm")
CONV = (
    "aten::conv2d",
    "aten::convolution",
    "aten::_convolution",
    "aten::mkldnn_convolution",
    "aten::_slow_conv2d_forward",
    "aten::thnn_conv2d",
    "aten::_nnpack_spatial_convolution",
)
SDPA = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu")


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once) by ``new`` in ``file``."""

    file: str
    old: str
    new: str


@dataclass(frozen=True)
class Case:
    """One realistic regression: the change, the test it touches, the ops to name."""

    name: str
    category: str
    test: str
    what: str
    edits: tuple[Edit, ...]
    expected: tuple[str, ...]


def _m(old: str, new: str) -> Edit:
    return Edit(project.MODELS_FILE, old, new)


def _t(old: str, new: str) -> Edit:
    return Edit(project.TESTS_FILE, old, new)


def _h(old: str, new: str) -> Edit:
    return Edit(project.HELPERS_FILE, old, new)


_SDPA_LINE = "        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
_POOL_LINE = "        pooled = torch.bmm(weights.unsqueeze(1), x).squeeze(1)\n"
_CLS_LAYERS = "            nn.ReLU(),\n            nn.Linear(hidden, classes),\n"
_CLS_LOGITS = "        logits = model(x)\n        loss = F.cross_entropy(logits, y)\n"
_CLS_STEP = (
    "        loss = F.cross_entropy(logits, y)\n        loss.backward()\n        opt.step()\n"
)

#: the regressions; ``expected`` was fixed before the first run and is not tuned to results
CASES: tuple[Case, ...] = (
    Case(
        "sdpa_to_matmul",
        "attention path",
        "test_attention",
        "attention through matmul + masked_fill + softmax instead of the fused SDPA op",
        (
            _m(
                "        self.proj = nn.Linear(d, d)\n",
                "        self.proj = nn.Linear(d, d)\n        self.register_buffer(\n"
                '            "causal", torch.ones(T, T, dtype=torch.bool).tril(), '
                "persistent=False\n"
                "        )\n",
            ),
            _m(
                _SDPA_LINE,
                "        att = (q @ k.transpose(-2, -1)) * (k.size(-1) ** -0.5)\n"
                '        att = att.masked_fill(~self.causal[:t, :t], float("-inf"))\n'
                "        y = F.softmax(att, dim=-1) @ v\n",
            ),
        ),
        (
            "aten::scaled_dot_product_attention",
            "aten::matmul",
            "aten::bmm",
            "aten::softmax",
            "aten::_softmax",
            "aten::masked_fill",
        ),
    ),
    Case(
        "causal_mask_tensor",
        "recompute per step",
        "test_attention",
        "an explicit causal mask tensor built every step instead of is_causal=True",
        (
            _m(
                _SDPA_LINE,
                "        causal = torch.ones(t, t, dtype=torch.bool).tril()\n"
                "        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)\n",
            ),
        ),
        ("aten::ones", "aten::tril"),
    ),
    Case(
        "softmax_f64",
        "dtype",
        "test_attention_pool",
        "the pooling softmax in float64",
        (
            _m(
                "        weights = F.softmax(scores, dim=1)\n",
                "        weights = F.softmax(scores.double(), dim=1).float()\n",
            ),
        ),
        ("aten::softmax", "aten::_softmax"),
    ),
    Case(
        "linear_f64",
        "dtype",
        "test_mlp_block",
        "the MLP's up projection in float64",
        (
            _m(
                "        self.up = nn.Linear(d, hidden)\n",
                "        self.up = nn.Linear(d, hidden).double()\n",
            ),
            _m("        h = self.up(h)\n", "        h = self.up(h.double()).float()\n"),
        ),
        LINEAR,
    ),
    Case(
        "loss_f64",
        "dtype",
        "test_gpt_train_step",
        "the GPT's loss computed in float64",
        (
            _t(
                "        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())\n",
                "        loss = F.cross_entropy(logits.flatten(0, 1).double(), target.flatten())\n",
            ),
        ),
        (
            "aten::cross_entropy_loss",
            "aten::log_softmax",
            "aten::_log_softmax",
            "aten::nll_loss",
            "aten::nll_loss_nd",
            "aten::nll_loss_forward",
            "LogSoftmaxBackward0",
            "aten::_log_softmax_backward_data",
            "NllLossBackward0",
            "aten::nll_loss_backward",
        ),
    ),
    Case(
        "item_sync",
        "sync",
        "test_classifier_train_step",
        "loss.item() logged every step",
        (_t(_CLS_STEP, _CLS_STEP + "        running = loss.item()  # logged every step\n"),),
        ("aten::item", "aten::_local_scalar_dense"),
    ),
    Case(
        "nan_check",
        "sync",
        "test_classifier_train_step",
        "a NaN check on the loss each step",
        (
            _t(
                "        loss = F.cross_entropy(logits, y)\n",
                "        loss = F.cross_entropy(logits, y)\n        if torch.isnan(loss):\n"
                '            raise FloatingPointError("loss is NaN")\n',
            ),
        ),
        ("aten::isnan", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense"),
    ),
    Case(
        "nonzero_count",
        "sync",
        "test_attention_pool",
        "counting real tokens with nonzero",
        (
            _m(
                "        weights = F.softmax(scores, dim=1)\n",
                "        weights = F.softmax(scores, dim=1)\n"
                "        self.n_tokens = mask.nonzero().size(0)  # for logging\n",
            ),
        ),
        ("aten::nonzero",),
    ),
    Case(
        "cpu_readback",
        "sync",
        "test_classifier_train_step",
        "predictions copied to the host each step for an accuracy metric",
        (
            _t(
                _CLS_LOGITS,
                _CLS_LOGITS.replace(
                    "model(x)\n", "model(x)\n        preds = logits.argmax(-1).cpu()  # accuracy\n"
                ),
            ),
        ),
        ("aten::argmax", "aten::to", "aten::_to_copy"),
    ),
    Case(
        "contiguous_qkv",
        "copy",
        "test_attention",
        "q, k, v made contiguous before SDPA",
        (
            _m(
                _SDPA_LINE,
                "        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()\n" + _SDPA_LINE,
            ),
        ),
        ("aten::contiguous", "aten::clone", "aten::copy_"),
    ),
    Case(
        "clone_input",
        "copy",
        "test_classifier_train_step",
        "a defensive copy of the input",
        (_t(_CLS_LOGITS, _CLS_LOGITS.replace("model(x)", "model(x.clone())")),),
        ("aten::clone", "aten::copy_"),
    ),
    Case(
        "channels_last",
        "copy",
        "test_convnet",
        "the input converted to channels_last",
        (
            _m(
                "        x = F.max_pool2d(",
                "        x = x.to(memory_format=torch.channels_last)\n        x = F.max_pool2d(",
            ),
        ),
        ("aten::to", "aten::_to_copy", "aten::copy_"),
    ),
    Case(
        "hidden_grown",
        "layer size",
        "test_mlp_block",
        "the MLP's hidden size 4 D -> 6 D",
        (
            _m(
                "    def __init__(self, d=D, hidden=4 * D):\n",
                "    def __init__(self, d=D, hidden=6 * D):\n",
            ),
        ),
        (*LINEAR, "aten::gelu"),
    ),
    Case(
        "channels_grown",
        "layer size",
        "test_convnet",
        "the conv net's width 8 -> 16 channels",
        (
            _m(
                "    def __init__(self, channels=8, classes=10):\n",
                "    def __init__(self, channels=16, classes=10):\n",
            ),
        ),
        CONV,
    ),
    Case(
        "extra_layer",
        "extra layer",
        "test_classifier_train_step",
        "one more Linear + ReLU in the classifier",
        (
            _m(
                _CLS_LAYERS,
                "            nn.ReLU(),\n            nn.Linear(hidden, hidden),\n" + _CLS_LAYERS,
            ),
        ),
        (
            *LINEAR,
            "aten::relu",
            "aten::clamp_min",
            "AddmmBackward0",
            "ReluBackward0",
            "aten::threshold_backward",
        ),
    ),
    Case(
        "extra_block",
        "extra layer",
        "test_gpt_train_step",
        "a third GPT block",
        (_m("    N_LAYER = 2\n", "    N_LAYER = 3\n"),),
        (
            *LINEAR,
            *SDPA,
            "aten::layer_norm",
            "aten::native_layer_norm",
            "aten::gelu",
            "AddmmBackward0",
            "NativeLayerNormBackward0",
            "aten::native_layer_norm_backward",
            "GeluBackward0",
            "aten::gelu_backward",
            "ScaledDotProductFlashAttentionForCpuBackward0",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        ),
    ),
    Case(
        "per_head_loop",
        "python loop",
        "test_attention",
        "a Python loop over heads, one SDPA call per head, then stack",
        (
            _m(
                _SDPA_LINE,
                "        y = torch.stack(\n"
                "            [F.scaled_dot_product_attention(q[:, h], k[:, h], v[:, h], "
                "is_causal=True)\n             for h in range(self.heads)],\n"
                "            dim=1,\n        )\n",
            ),
        ),
        (*SDPA, "aten::select", "aten::stack"),
    ),
    Case(
        "per_sample_loop",
        "python loop",
        "test_convnet",
        "the conv net run one sample at a time, then cat",
        (
            _t(
                "            logits = model(x)\n    assert logits.shape == (4, 10)\n",
                "            logits = torch.cat([model(x[i : i + 1]) for i in range(x.shape[0])])\n"
                "    assert logits.shape == (4, 10)\n",
            ),
        ),
        (*CONV, "aten::cat", "aten::slice"),
    ),
    Case(
        "bmm_loop",
        "python loop",
        "test_attention_pool",
        "the weighted sum as a Python loop over the batch instead of one bmm",
        (
            _m(
                _POOL_LINE,
                "        pooled = torch.stack([weights[i] @ x[i] for i in range(x.shape[0])])\n",
            ),
        ),
        ("aten::bmm", "aten::matmul", "aten::mv", "aten::mm", "aten::stack", "aten::select"),
    ),
    Case(
        "gelu_manual",
        "fusion removed",
        "test_mlp_block",
        "GELU written out as the tanh formula instead of F.gelu",
        (
            _h(
                '    return F.gelu(h, approximate="tanh")\n',
                "    return 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h**3)))\n",
            ),
            _h(
                "from torch.nn import functional as F\n",
                "import torch\nfrom torch.nn import functional as F\n",
            ),
        ),
        ("aten::gelu", "aten::tanh", "aten::pow", "aten::mul", "aten::add"),
    ),
    Case(
        "layernorm_manual",
        "fusion removed",
        "test_mlp_block",
        "LayerNorm written out as mean / var instead of the fused op",
        (
            _m(
                "        h = self.norm(x)\n",
                "        mean = x.mean(-1, keepdim=True)\n"
                "        var = x.var(-1, keepdim=True, unbiased=False)\n"
                "        h = (x - mean) / torch.sqrt(var + self.norm.eps)\n"
                "        h = h * self.norm.weight + self.norm.bias\n",
            ),
        ),
        (
            "aten::layer_norm",
            "aten::native_layer_norm",
            "aten::mean",
            "aten::var",
            "aten::sub",
            "aten::sqrt",
            "aten::div",
            "aten::mul",
            "aten::add",
        ),
    ),
    Case(
        "addmm_split",
        "fusion removed",
        "test_attention_pool",
        "the head as matmul + add instead of nn.Linear's addmm",
        (
            _m(
                "        return self.head(pooled)\n",
                "        return pooled @ self.head.weight.t() + self.head.bias\n",
            ),
        ),
        (*LINEAR, "aten::add"),
    ),
    Case(
        "extra_dropout",
        "extra activation",
        "test_classifier_train_step",
        "a dropout layer added to the classifier",
        (
            _m(
                _CLS_LAYERS,
                "            nn.ReLU(),\n            nn.Dropout(0.1),\n"
                "            nn.Linear(hidden, classes),\n",
            ),
        ),
        (
            "aten::dropout",
            "aten::native_dropout",
            "aten::bernoulli_",
            "NativeDropoutBackward0",
            "aten::native_dropout_backward",
        ),
    ),
    Case(
        "extra_activation",
        "extra activation",
        "test_attention_pool",
        "a tanh squashing the token scores",
        (
            _m(
                "        scores = self.score(x).squeeze(-1)\n",
                "        scores = torch.tanh(self.score(x)).squeeze(-1)\n",
            ),
        ),
        ("aten::tanh",),
    ),
    Case(
        "softmax_twice",
        "repeated computation",
        "test_attention_pool",
        "the softmax inlined into the bmm while the old line stays: computed twice",
        (
            _m(
                _POOL_LINE,
                "        pooled = torch.bmm(F.softmax(scores, dim=1).unsqueeze(1), x).squeeze(1)\n",
            ),
        ),
        ("aten::softmax", "aten::_softmax"),
    ),
    Case(
        "mask_recompute",
        "recompute per step",
        "test_attention_pool",
        "the padding mask rebuilt every step instead of once per batch",
        (
            _t(
                "            logits = model(x, mask)\n",
                "            logits = model(x, models.padding_mask(lengths))\n",
            ),
        ),
        ("aten::arange", "aten::lt", "aten::unsqueeze", "aten::slice"),
    ),
)
#: refactors and moved code (issue 40): each is a change a contributor makes while
#: restructuring, with a regression inside it; the first line must name the op *and* the
#: changed line (``lines``), written down before any result was seen
REFACTORS: tuple[Case, ...] = (
    Case(
        "qkv_split",
        "refactor: fused layer split",
        "test_attention",
        "the fused q/k/v projection split into three Linear layers",
        (
            _m(
                "        self.qkv = nn.Linear(d, 3 * d)\n",
                "        self.q = nn.Linear(d, d)\n        self.k = nn.Linear(d, d)\n"
                "        self.v = nn.Linear(d, d)\n",
            ),
            _m(
                "        q, k, v = self.qkv(x).split(d, dim=-1)\n",
                "        q, k, v = self.q(x), self.k(x), self.v(x)\n",
            ),
        ),
        (*LINEAR, "aten::split", "aten::narrow", "aten::slice"),
    ),
    Case(
        "mlp_up_split",
        "refactor: fused layer split",
        "test_mlp_block",
        "the MLP's up projection split in two halves, then concatenated",
        (
            _m(
                "        self.up = nn.Linear(d, hidden)\n",
                "        self.up_a = nn.Linear(d, hidden // 2)\n"
                "        self.up_b = nn.Linear(d, hidden // 2)\n",
            ),
            _m(
                "        h = self.up(h)\n",
                "        h = torch.cat([self.up_a(h), self.up_b(h)], dim=-1)\n",
            ),
        ),
        (*LINEAR, "aten::cat"),
    ),
    Case(
        "split_heads_moved",
        "moved code",
        "test_attention",
        "the head split moved into helpers.py, with a .contiguous() on the way",
        (
            _m(
                "        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)\n"
                "        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)\n"
                "        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)\n",
                "        q, k, v = (helpers.split_heads(z, self.heads) for z in (q, k, v))\n",
            ),
            _h(
                "def gelu(h):\n",
                "def split_heads(x, heads):\n"
                '    """(b, t, d) -> (b, heads, t, d // heads), contiguous for the kernels."""\n'
                "    b, t, d = x.shape\n"
                "    return x.view(b, t, heads, d // heads).transpose(1, 2).contiguous()\n\n\n"
                "def gelu(h):\n",
            ),
        ),
        ("aten::contiguous", "aten::clone", "aten::copy_", "aten::empty_like"),
    ),
    Case(
        "mask_moved_per_call",
        "moved code",
        "test_attention_pool",
        "the padding mask built inside the model from the lengths, by a helper moved to helpers.py",
        (
            _h(
                "def gelu(h):\n",
                "def padding_mask(lengths, t):\n"
                '    """True where a token is real."""\n'
                "    return torch.arange(t)[None, :] < lengths[:, None]\n\n\n"
                "def gelu(h):\n",
            ),
            _h(
                "from torch.nn import functional as F\n",
                "import torch\nfrom torch.nn import functional as F\n",
            ),
            _m(
                '        scores = scores.masked_fill(~mask, float("-inf"))\n',
                "        mask = helpers.padding_mask(mask.sum(1), x.shape[1])\n"
                '        scores = scores.masked_fill(~mask, float("-inf"))\n',
            ),
        ),
        ("aten::arange", "aten::lt", "aten::sum", "aten::unsqueeze", "aten::slice"),
    ),
    Case(
        "clamp_in_layer_loop",
        "op in a loop over layers",
        "test_gpt_train_step",
        "activations clamped after every block, inside the loop over layers",
        (
            _m(
                "        for block in self.blocks:\n            x = block(x)\n",
                "        for block in self.blocks:\n            x = block(x).clamp(-30.0, 30.0)\n",
            ),
        ),
        (
            "aten::clamp",
            "ClampBackward1",
            "aten::clamp_backward",
            "aten::where",
            "aten::ge",
            "aten::le",
            "aten::logical_and",
            "aten::mul",
        ),
    ),
    Case(
        "finite_check_in_layer_loop",
        "op in a loop over layers",
        "test_gpt_train_step",
        "a finiteness check after every block (a host sync per layer)",
        (
            _m(
                "        for block in self.blocks:\n            x = block(x)\n",
                "        for block in self.blocks:\n            x = block(x)\n"
                '            assert torch.isfinite(x).all(), "non-finite activations"\n',
            ),
        ),
        (
            "aten::isfinite",
            "aten::all",
            "aten::is_nonzero",
            "aten::item",
            "aten::_local_scalar_dense",
            "aten::abs",
            "aten::ne",
            "aten::eq",
            "aten::mul",
        ),
    ),
    Case(
        "optimizer_momentum",
        "optimizer change",
        "test_gpt_train_step",
        "SGD with momentum (a buffer per parameter, updated every step)",
        (
            _t(
                "    model = models.TinyGPT()\n    opt = torch.optim.SGD(model.parameters(), "
                "lr=1e-2)\n",
                "    model = models.TinyGPT()\n    opt = torch.optim.SGD(model.parameters(), "
                "lr=1e-2, momentum=0.9)\n",
            ),
        ),
        (
            "Optimizer.step#SGD.step",
            "aten::mul_",
            "aten::add_",
            "aten::_foreach_mul_",
            "aten::_foreach_add_",
            "aten::clone",
            "aten::detach",
        ),
    ),
    Case(
        "grad_clip",
        "optimizer change",
        "test_classifier_train_step",
        "gradient clipping before each optimizer step",
        (
            _t(
                "        loss.backward()\n        opt.step()\n        helpers.log_metric",
                "        loss.backward()\n"
                "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
                "        opt.step()\n        helpers.log_metric",
            ),
        ),
        (
            "aten::linalg_vector_norm",
            "aten::_foreach_norm",
            "aten::stack",
            "aten::clamp",
            "aten::_foreach_mul_",
            "aten::mul",
            "aten::add",
            "aten::reciprocal",
            "aten::div",
            "aten::clamp_max",
            "aten::norm",
        ),
    ),
    Case(
        "causal_buffer_per_call",
        "buffer built per call",
        "test_attention",
        "a causal mask buffer built on every call instead of SDPA's is_causal",
        (
            _m(
                _SDPA_LINE,
                "        mask = torch.ones(t, t, dtype=torch.bool).tril()\n"
                "        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n",
            ),
        ),
        ("aten::ones", "aten::tril", "aten::empty", "aten::fill_"),
    ),
    Case(
        "log_metric_item",
        "logging .item()",
        "test_classifier_train_step",
        "the metric logger turned into a float with .item() (a host sync every step)",
        (
            _h(
                "    METRICS[name] = value.detach()\n",
                "    METRICS[name] = value.detach().item()\n",
            ),
        ),
        ("aten::item", "aten::_local_scalar_dense"),
    ),
    Case(
        "softmax_f64_helper",
        "dtype cast in a helper",
        "test_attention_pool",
        "the pooling softmax moved into a helper that computes it in float64",
        (
            _h(
                "def gelu(h):\n",
                "def stable_softmax(scores, dim):\n"
                '    """Softmax in float64: no overflow for large scores."""\n'
                "    return F.softmax(scores.double(), dim=dim).float()\n\n\n"
                "def gelu(h):\n",
            ),
            _m(
                "        weights = F.softmax(scores, dim=1)\n",
                "        weights = helpers.stable_softmax(scores, dim=1)\n",
            ),
        ),
        ("aten::softmax", "aten::_softmax", "aten::to", "aten::_to_copy"),
    ),
    Case(
        "gelu_f64_helper",
        "dtype cast in a helper",
        "test_mlp_block",
        "the shared activation helper computing in float64",
        (
            _h(
                '    return F.gelu(h, approximate="tanh")\n',
                '    return F.gelu(h.double(), approximate="tanh").to(h.dtype)\n',
            ),
        ),
        ("aten::gelu", "aten::to", "aten::_to_copy"),
    ),
)
#: changes that cost nothing measurable (issue 55's other side of the catalogue): none may
#: fail; fixed before the first run. ``expected`` is empty: nothing should be named
FREE: tuple[Case, ...] = (
    Case(
        "free_docstring",
        "free: text",
        "test_mlp_block",
        "a docstring reworded",
        (
            _m(
                '    """Pre-norm MLP with a residual: LayerNorm, Linear, GELU (tanh), Linear."""\n',
                '    """An MLP with a pre-norm and a residual connection."""\n',
            ),
        ),
        (),
    ),
    Case(
        "free_rename_attr",
        "free: rename",
        "test_mlp_block",
        "a submodule renamed",
        (
            _m("        self.norm = nn.LayerNorm(d)\n", "        self.ln = nn.LayerNorm(d)\n"),
            _m("        h = self.norm(x)\n", "        h = self.ln(x)\n"),
        ),
        (),
    ),
    Case(
        "free_rename_class",
        "free: rename",
        "test_classifier_train_step",
        "the model class renamed",
        (
            _m("class Classifier(nn.Module):\n", "class MLPClassifier(nn.Module):\n"),
            _t("    model = models.Classifier()\n", "    model = models.MLPClassifier()\n"),
        ),
        (),
    ),
    Case(
        "free_reorder_zero_grad",
        "free: reorder",
        "test_classifier_train_step",
        "zero_grad moved after the forward pass (independent of it)",
        (
            _t(
                "        opt.zero_grad(set_to_none=True)\n        logits = model(x)\n",
                "        logits = model(x)\n        opt.zero_grad(set_to_none=True)\n",
            ),
        ),
        (),
    ),
    Case(
        "free_unused_default",
        "free: default",
        "test_attention",
        "a constructor default added that nothing uses",
        (
            _m(
                "    def __init__(self, d=D, heads=HEADS):\n",
                "    def __init__(self, d=D, heads=HEADS, dropout=0.0):\n",
            ),
        ),
        (),
    ),
    Case(
        "free_helper_default",
        "free: default",
        "test_classifier_train_step",
        "a helper's new keyword default, not passed by any caller",
        (_h("def log_metric(name, value):\n", "def log_metric(name, value, every=1):\n"),),
        (),
    ),
    Case(
        "free_seed",
        "free: data",
        "test_mlp_block",
        "another random seed (same shapes)",
        (_t("    torch.manual_seed(0)\n", "    torch.manual_seed(1)\n"),),
        (),
    ),
    Case(
        "free_assert_message",
        "free: text",
        "test_attention",
        "an assertion after the loop given a message",
        (
            _t(
                "            y = model(x)\n    assert y.shape == x.shape\n\n\n"
                "@pytest.mark.gpuprofile(**ROUNDS)\ndef test_mlp_block",
                '            y = model(x)\n    assert y.shape == x.shape, "shape"\n\n\n'
                "@pytest.mark.gpuprofile(**ROUNDS)\ndef test_mlp_block",
            ),
        ),
        (),
    ),
    Case(
        "free_type_hints",
        "free: text",
        "test_convnet",
        "type hints on forward",
        (
            _m(
                "    def forward(self, x):\n        x = F.max_pool2d(",
                "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
                "        x = F.max_pool2d(",
            ),
        ),
        (),
    ),
    Case(
        "free_relu_spelling",
        "free: same op",
        "test_convnet",
        "F.relu spelled torch.relu",
        (_m("        x = F.relu(self.conv2(x))\n", "        x = torch.relu(self.conv2(x))\n"),),
        (),
    ),
    Case(
        "free_lengths_dtype",
        "free: outside the step",
        "test_attention_pool",
        "the lengths tensor built as int32 (the mask is made once, before the loop)",
        (
            _t(
                "    lengths = torch.tensor([models.T, models.T // 2])\n",
                "    lengths = torch.tensor([models.T, models.T // 2], dtype=torch.int32)\n",
            ),
        ),
        (),
    ),
    Case(
        "free_scalar_fill",
        "free: scalar",
        "test_attention_pool",
        "the padding fill value written -1e30 (a Python scalar either way)",
        (
            _m(
                '        scores = scores.masked_fill(~mask, float("-inf"))\n',
                "        scores = scores.masked_fill(~mask, -1e30)\n",
            ),
        ),
        (),
    ),
    Case(
        "free_metric_clone",
        "free: bytes",
        "test_classifier_train_step",
        "the logged loss cloned (a 0-d tensor: 4 bytes a step)",
        (
            _h(
                "    METRICS[name] = value.detach()\n",
                "    METRICS[name] = value.detach().clone()\n",
            ),
        ),
        (),
    ),
    Case(
        "free_eval_dropped",
        "free: no-op",
        "test_attention",
        ".eval() dropped on a model without dropout or norm statistics",
        (
            _t(
                "    model = models.CausalSelfAttention().eval()\n",
                "    model = models.CausalSelfAttention()\n",
            ),
        ),
        (),
    ),
    Case(
        "free_flatten_view",
        "free: same op",
        "test_convnet",
        "flatten(1) written as reshape",
        (
            _m(
                "        x = F.adaptive_avg_pool2d(x, 1).flatten(1)\n",
                "        x = F.adaptive_avg_pool2d(x, 1).reshape(x.shape[0], -1)\n",
            ),
        ),
        (),
    ),
    Case(
        "free_comment_in_loop",
        "free: text",
        "test_gpt_train_step",
        "a comment in the loop",
        (
            _t(
                "        logits = model(idx)\n",
                "        logits = model(idx)  # next-token logits\n",
            ),
        ),
        (),
    ),
    Case(
        "free_gelu_helper_rename",
        "free: rename",
        "test_mlp_block",
        "the activation helper renamed at its definition and its call",
        (
            _h("def gelu(h):\n", "def activation(h):\n"),
            _m("        h = helpers.gelu(h)\n", "        h = helpers.activation(h)\n"),
        ),
        (),
    ),
    Case(
        "free_scale_constant",
        "free: scalar",
        "test_attention_pool",
        "an integer class count written as a float and converted back",
        (
            _m(
                "    def __init__(self, d=D, classes=10):\n        super().__init__()\n"
                "        self.score",
                "    def __init__(self, d=D, classes=int(10.0)):\n        super().__init__()\n"
                "        self.score",
            ),
        ),
        (),
    ),
    Case(
        "free_buffer_unused",
        "free: unused",
        "test_convnet",
        "a buffer registered that forward never reads",
        (
            _m(
                "        self.fc = nn.Linear(2 * channels, classes)\n",
                "        self.fc = nn.Linear(2 * channels, classes)\n"
                '        self.register_buffer("version", torch.tensor(2), persistent=False)\n',
            ),
        ),
        (),
    ),
    Case(
        "free_position_arange_once",
        "free: tiny op",
        "test_gpt_train_step",
        "the position index's arange given an explicit dtype (the same int64)",
        (
            _m(
                "        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))\n",
                "        x = self.tok(idx) + self.pos(\n"
                "            torch.arange(idx.shape[1], dtype=torch.long)\n        )\n",
            ),
        ),
        (),
    ),
)
TESTS = (
    "test_attention",
    "test_mlp_block",
    "test_attention_pool",
    "test_convnet",
    "test_classifier_train_step",
    "test_gpt_train_step",
)


def _tf(old: str, new: str) -> Edit:
    return Edit(frameworks.MODELS_FILE, old, new)


def _jx(old: str, new: str) -> Edit:
    return Edit(frameworks.HELPERS_FILE, old, new)


def _ft(old: str, new: str) -> Edit:
    return Edit(frameworks.TESTS_FILE, old, new)


#: the CNN's and the transformer's layers, as their ops' scopes and TF op types name them
_TF_CNN = ("conv", "pool", "flat", "logits", "Conv2D", "MatMul", "BiasAdd", "Relu", "MaxPool")
_TF_BLOCK = ("block0", "block1", "block2", "attn", "mlp", "norm", "head", "MatMul", "Einsum")
_TF_INPUT = ("IteratorGetNext", "OptionalGetValue", "OptionalHasValue")
_CNN_STEP = "            logits = model(x, training=True)\n"
_CNN_CALL = "        step(x, y)\n"
_CNN_LOOP = "    for _ in gpuprofile.iterations():\n        x, y = next(data)\n"
_TF_DATA = "    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()\n"
_ATTN_LOOP = "    for _ in gpuprofile.iterations():\n        models_jax.attention_step(x)"
#: issue 50's catalogue, eight per framework; ``expected`` fixed before the first run. A
#: JAX case expects its jitted function's ops (``jit_mlp_step::``: XLA's fusions are not
#: named after what they hold); a component matches a name ending in ``::`` by prefix
FRAMEWORK_CASES: tuple[Case, ...] = (
    Case(
        "tf_model_twice",
        "TF: the model called twice",
        "test_tf_cnn",
        "the CNN called a second time in the step (logits recomputed for a metric)",
        (_ft(_CNN_STEP, _CNN_STEP + "            probs = tf.nn.softmax(model(x))\n"),),
        (*_TF_CNN, "Softmax"),
    ),
    Case(
        "tf_model_twice_used",
        "TF: the model called twice",
        "test_tf_cnn",
        "the CNN called a second time for an auxiliary loss on half-scaled inputs (added "
        "after the first run: tf_model_twice's second call was unused, and Grappler pruned it)",
        (
            _ft(
                "            loss = loss_fn(y, logits)\n",
                "            loss = loss_fn(y, logits)\n"
                "            loss += loss_fn(y, model(x * 0.5, training=True))\n",
            ),
        ),
        _TF_CNN,
    ),
    Case(
        "tf_conv_wider",
        "TF: a layer widened",
        "test_tf_cnn",
        "the convolution's channels 8 -> 32",
        (_tf("def cnn(width=8):", "def cnn(width=32):"),),
        _TF_CNN,
    ),
    Case(
        "tf_float64",
        "TF: precision",
        "test_tf_cnn",
        "the CNN built in float64 (keras.backend.set_floatx)",
        (
            _tf(
                "keras.utils.set_random_seed(0)\n",
                'keras.utils.set_random_seed(0)\nkeras.backend.set_floatx("float64")\n',
            ),
        ),
        (*_TF_CNN, "Cast"),
    ),
    Case(
        "tf_host_sync",
        "TF: a host sync in the step",
        "test_tf_cnn",
        "the loss read back to Python every step (.numpy())",
        (_ft(_CNN_CALL, "        float(step(x, y).numpy())\n"),),
        (*_TF_CNN, "step", "numpy"),
    ),
    Case(
        "tf_retrace",
        "TF: a retrace per step",
        "test_tf_cnn",
        "the step given its iteration as a Python int: a new trace every step",
        (
            _ft("    def step(x, y):\n", "    def step(x, y, i):\n"),
            _ft(
                _CNN_LOOP + _CNN_CALL,
                _CNN_LOOP.replace("for _ in", "for i in") + "        step(x, y, i)\n",
            ),
        ),
        (*_TF_CNN, "step"),
    ),
    Case(
        "tf_no_function",
        "TF: the compiler taken away",
        "test_tf_cnn",
        "@tf.function removed: the step runs op by op",
        (_ft("    @tf.function\n    def step(x, y):\n", "    def step(x, y):\n"),),
        (*_TF_CNN, "step"),
    ),
    Case(
        "tf_deeper",
        "TF: a loop unrolled deeper",
        "test_tf_transformer_fit",
        "the transformer built with 3 blocks instead of 2",
        (_tf("def transformer(depth=2,", "def transformer(depth=3,"),),
        _TF_BLOCK,
    ),
    Case(
        "tf_input_slower",
        "TF: a slower input pipeline",
        "test_tf_transformer_fit",
        "each element normalised in the tf.data pipeline (a map per element)",
        (
            _tf(
                "    y = tf.random.stateless_normal((n, 4), seed=(7, 8))\n" + _TF_DATA,
                "    y = tf.random.stateless_normal((n, 4), seed=(7, 8))\n"
                "    ds = tf.data.Dataset.from_tensor_slices((x, y))\n"
                "    ds = ds.map(lambda a, b: (tf.nn.l2_normalize(tf.cumsum(a, 0), -1), b))\n"
                "    return ds.batch(16).repeat()\n",
            ),
        ),
        _TF_INPUT,
    ),
    Case(
        "jax_model_twice",
        "JAX: the model called twice",
        "test_jax_mlp",
        "the loss adds a second forward pass (a consistency term)",
        (
            _jx(
                "    return jnp.mean((logits - y) ** 2)\n",
                "    again = mlp(params, x * 0.5)\n"
                "    return jnp.mean((logits - y) ** 2) + jnp.mean(again**2)\n",
            ),
        ),
        ("jit_mlp_step::",),
    ),
    Case(
        "jax_wider",
        "JAX: a layer widened",
        "test_jax_mlp",
        "the MLP's hidden width 64 -> 512",
        (_jx("def mlp_params(width=64,", "def mlp_params(width=512,"),),
        ("jit_mlp_step::",),
    ),
    Case(
        "jax_half_round_trip",
        "JAX: precision",
        "test_jax_attention",
        "the attention's input sent through float16 and back each layer",
        (
            _jx(
                "        w = jax.nn.softmax(",
                "        x = x.astype(jnp.float16).astype(DTYPE)\n        w = jax.nn.softmax(",
            ),
        ),
        ("jit_attention::",),
    ),
    Case(
        "jax_host_sync",
        "JAX: a host sync in the step",
        "test_jax_mlp",
        "the parameters read back to the host every step (jax.device_get)",
        (
            _ft(
                "        jax.block_until_ready(params)\n",
                "        params = jax.device_put(jax.device_get(params))\n",
            ),
        ),
        ("jit_mlp_step::", "device_get", "device_put"),
    ),
    Case(
        "jax_recompile",
        "JAX: a recompile per step",
        "test_jax_attention",
        "the depth made a static argument that changes every step: a compile each time",
        (
            _jx(
                "attention_step = jax.jit(attention)\n",
                "attention_step = jax.jit(attention, static_argnums=1)\n",
            ),
            _ft(
                _ATTN_LOOP,
                _ATTN_LOOP.replace("for _ in", "for i in").replace("(x)", "(x, 2 + i % 2)"),
            ),
        ),
        ("jit_attention::",),
    ),
    Case(
        "jax_no_jit",
        "JAX: the compiler taken away",
        "test_jax_mlp",
        "@jax.jit removed from the training step: op-by-op dispatch",
        (_jx("@jax.jit\ndef mlp_step(", "def mlp_step("),),
        ("jit_mlp_step::", "jit_dot_general::", "jit_tanh::", "mlp_step", "dot_general"),
    ),
    Case(
        "jax_deeper",
        "JAX: a loop unrolled deeper",
        "test_jax_attention",
        "the attention loop run 3 times instead of 2",
        (_jx("def attention(x, depth=2):", "def attention(x, depth=3):"),),
        ("jit_attention::",),
    ),
    Case(
        "jax_extra_op",
        "JAX: an extra op",
        "test_jax_mlp",
        "a layer norm added before the MLP's second matmul",
        (
            _jx(
                '    h = jnp.tanh(x @ params["w1"])\n',
                '    h = jnp.tanh(x @ params["w1"])\n'
                "    h = (h - h.mean(-1, keepdims=True)) / (h.std(-1, keepdims=True) + 1e-5)\n",
            ),
        ),
        ("jit_mlp_step::",),
    ),
)
FRAMEWORK_TESTS = frameworks.NAMES


# --------------------------------------------------------------------------- plumbing


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def uptime() -> str:
    """``uptime``'s line: the load the numbers were measured under."""
    done = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=culprits",
            "-c",
            "user.email=culprits@perfguard.invalid",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"culprits: git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def child_env() -> dict[str, str]:
    """This checkout's perfguard first on the path (the children must judge with it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    return env


def check_import(cwd: Path) -> str:
    """Where a child imports perfguard from; it must be this checkout."""
    done = subprocess.run(
        [sys.executable, "-c", "import perfguard.plugin as p; print(p.__file__)"],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    path = done.stdout.strip()
    if not path.startswith(str(ROOT)):
        raise SystemExit(f"culprits: a child imports perfguard from {path!r}, not {ROOT}")
    return path


def changed_lines(base: str, head: str) -> dict[str, list[int]]:
    """1-based lines a change replaced or added in the head and replaced or removed in the
    base (difflib's opcodes), the lines a reviewer should be sent to."""
    import difflib

    out: dict[str, list[int]] = {"head": [], "base": []}
    ops = difflib.SequenceMatcher(a=base.splitlines(), b=head.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in ops.get_opcodes():
        if tag == "equal":
            continue
        out["base"] += range(i1 + 1, max(i2, i1 + 1) + 1) if tag != "insert" else [i1 + 1]
        out["head"] += range(j1 + 1, max(j2, j1 + 1) + 1) if tag != "delete" else [j1 + 1]
    return out


#: a place in a culprit's line: ``models.py:21`` or ``models.py:15-18``
_PLACE = re.compile(r"([\w./-]+\.py):(\d+)(?:-(\d+))?")


def line_right(text: str, lines: dict[str, dict[str, list[int]]]) -> bool:
    """Whether ``text`` (the test's first line) names a changed line, ±1: any place in it
    in a changed file whose lines come within one of a line the change touched."""
    for m in _PLACE.finditer(text):
        file, lo = Path(m.group(1)).name, int(m.group(2))
        hi = int(m.group(3) or lo)
        touched = lines.get(file)
        if not touched:
            continue
        if any(lo - 1 <= n <= hi + 1 for n in (*touched["head"], *touched["base"])):
            return True
    return False


def apply(repo: Path, edits: tuple[Edit, ...]) -> None:
    for e in edits:
        path = repo / e.file
        text = path.read_text()
        if text.count(e.old) != 1:
            raise SystemExit(
                f"culprits: edit of {e.file} matches {text.count(e.old)} times:\n{e.old}"
            )
        path.write_text(text.replace(e.old, e.new))


class Project:
    """The temp git project: the base, one commit per case, the A/A commit."""

    def __init__(
        self, folder: Path, iterations: int, rounds: int, warmup: int, suite: Any = project
    ) -> None:
        self.suite = suite  # culprit_project (torch) or framework_project (TF, JAX)
        self.dir = folder / "project"
        self.store = folder / "store.db"
        self.dir.mkdir(parents=True)
        git(self.dir, "init", "-q", "-b", "main")
        for name, text in suite.files(iterations, rounds, warmup).items():
            (self.dir / name).write_text(text)
        git(self.dir, "add", "-A")
        git(self.dir, "commit", "-q", "-m", "base: small models and their benchmarks")
        self.base = git(self.dir, "rev-parse", "HEAD")
        self.commits: dict[str, str] = {}
        #: per case, per file: the lines the change touched in the head and in the base
        self.lines: dict[str, dict[str, dict[str, list[int]]]] = {}

    def commit(self, name: str, message: str, edits: tuple[Edit, ...]) -> str:
        git(self.dir, "checkout", "-q", "--detach", self.base)
        before = {e.file: (self.dir / e.file).read_text() for e in edits}
        apply(self.dir, edits)
        self.lines[name] = {
            f: changed_lines(text, (self.dir / f).read_text()) for f, text in before.items()
        }
        git(self.dir, "commit", "-q", "-am", f"{name}: {message}")
        self.commits[name] = git(self.dir, "rev-parse", "HEAD")
        return self.commits[name]

    def checkout(self, sha: str) -> None:
        git(self.dir, "checkout", "-q", "--detach", sha)


def run_session(
    proj: Project, args: list[str], folder: Path, tests: list[str], timeout: float
) -> dict[str, Any]:
    """One ``pytest --perfguard`` session; its stdout, results.json and summary.md."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    # "--opt=PATH": pytest would take an absolute path given as its own argument as a
    # candidate rootdir, and the rootdir is where perfguard reads the git state
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *(f"{proj.suite.TESTS_FILE}::{t}" for t in tests),
        "-q",
        "--perfguard",
        f"--perfguard-output={folder}",
        f"--perfguard-store={proj.store}",
        f"--rootdir={proj.dir}",
        *args,
    ]
    load, t0 = uptime(), time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=proj.dir,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        code, stdout = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout = -1, f"timed out after {timeout:g} s\n{exc.stdout or ''}"
    wall = time.monotonic() - t0
    (folder / "stdout.log").write_text(stdout if isinstance(stdout, str) else str(stdout))
    for junk in ("captures", "ab"):
        shutil.rmtree(folder / junk, ignore_errors=True)
    doc = None
    if (folder / "results.json").is_file():
        doc = json.loads((folder / "results.json").read_text())
    summary = (folder / "summary.md").read_text() if (folder / "summary.md").is_file() else ""
    return {
        "argv": argv[3:],
        "returncode": code,
        "wall_s": round(wall, 1),
        "load": load,
        "stdout": stdout,
        "results": doc,
        "summary": summary,
    }


# --------------------------------------------------------------------------- judging


def components(op: str) -> list[str]:
    """An op path's parts, autograd's engine prefix dropped (``AddmmBackward0``)."""
    return [p.replace(AUTOGRAD, "").strip() for p in op.split("/") if p.strip()]


def named(part: str, expected: tuple[str, ...]) -> bool:
    """An op path's component is an expected name, or starts with an expected name that
    ends in ``::`` (a JAX case's jitted function: ``jit_mlp_step::``)."""
    return part in expected or any(e.endswith("::") and part.startswith(e) for e in expected)


def failure_section(stdout: str, test: str) -> str:
    """The failure message pytest printed for ``test`` (its part of FAILURES), or ""."""
    m = re.search(rf"_+ {re.escape(test)} _+\n", stdout)
    if not m:
        return ""
    rest = stdout[m.end() :]
    end = re.search(r"\n(_{3,} \S|={3,} )", rest)
    return rest[: end.start()] if end else rest


def summary_text(md: str) -> str:
    """summary.md as plain text: Markdown escapes and HTML entities undone."""
    return html.unescape(re.sub(r"\\(.)", r"\1", md))


def judge_case(
    case: Case | None,
    test: str,
    session: dict[str, Any],
    lines: dict[str, dict[str, list[int]]] | None = None,
) -> dict[str, Any]:
    """One test of one session: outcome, first culprit, right or not, views agreeing."""
    row: dict[str, Any] = {
        "test": test,
        "outcome": "missing",
        "returncode": session["returncode"],
        "wall_s": session["wall_s"],
    }
    doc = session["results"]
    entry = None
    if doc:
        entry = next((t for t in doc.get("tests", []) if t["nodeid"].endswith(f"::{test}")), None)
    if entry is None:
        row["error"] = session["stdout"][-1500:]
        return row
    why = entry.get("explanation") or {}
    culprits = why.get("culprits") or []
    first = culprits[0] if culprits else {}
    row.update(
        outcome=entry["outcome"],
        decided_by=why.get("decided_by", ""),
        headline=why.get("headline", ""),
        lead=why.get("lead", ""),
        first_op=first.get("op", ""),
        first_kind=first.get("kind", ""),
        first_text=first.get("text", ""),
        culprits=[f"{c.get('kind')}: {c.get('op')}" for c in culprits[:6]],
        timing=(entry.get("timing") or {}).get("outcome"),
        gates=(entry.get("gates") or {}).get("outcome"),
        delta_pct=(entry.get("timing") or {}).get("delta_pct"),
    )
    if case is not None:
        parts = components(row["first_op"])
        row["right"] = any(named(p, case.expected) for p in parts)
        row["leaf_right"] = bool(parts) and named(parts[-1], case.expected)
    lead = row["lead"]
    if row["outcome"] == "regressed" and lead:
        fail = failure_section(session["stdout"], test)
        md = summary_text(session["summary"])
        md_line = next((x for x in md.splitlines() if f"::{test}`" in x), "")
        row["failure_has_lead"] = lead in fail
        row["summary_has_lead"] = lead[:100] in md
        row["summary_line_has_lead"] = lead[:100] in md_line
        leaf = components(row["first_op"])[-1] if row["first_op"] else ""
        row["views_name_first_op"] = bool(leaf) and leaf in fail and leaf in md
        rows = [x for x in session["stdout"].splitlines() if f"::{test} " in x]
        row["terminal_has_lead"] = any(lead[:40] in x for x in rows)
        row["views_agree"] = row["failure_has_lead"] and row["summary_has_lead"]
        row["summary_line"] = md_line
        if lines is not None:
            # the line a reviewer reads first: the test's line in summary.md
            row["line_right"] = line_right(md_line, lines)
            row["op_and_line_right"] = bool(row.get("right")) and row["line_right"]
    return row


def rate(rows: list[dict[str, Any]], key: str, of: list[dict[str, Any]] | None = None) -> str:
    """``k / n (p %)`` of the rows where ``key`` is true."""
    pool = rows if of is None else of
    n = len(pool)
    k = sum(1 for r in pool if r.get(key))
    return f"{k} / {n} ({100 * k / n:.0f} %)" if n else "0 / 0"


def tally(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: detection, first culprit right (of all and of the detected), views."""
    out: dict[str, Any] = {}
    for mode in sorted({r["mode"] for r in rows}):
        cases = [r for r in rows if r["mode"] == mode and r["kind"] == "case"]
        aa = [r for r in rows if r["mode"] == mode and r["kind"] == "aa"]
        free = [r for r in rows if r["mode"] == mode and r["kind"] == "free"]
        for r in free:
            r["failed"] = r["outcome"] == "regressed"
        for r in cases:
            r["detected"] = r["outcome"] == "regressed"
            # right only where a reviewer reads it: a failure message and summary.md line
            r["right_and_detected"] = r["detected"] and bool(r.get("right"))
        found = [r for r in cases if r["detected"]]
        for r in aa:
            r["false_alarm"] = r["outcome"] in ("regressed", "improved")
        out[mode] = {
            "cases": len(cases),
            "detected": rate(cases, "detected"),
            "first_culprit_right": rate(cases, "right_and_detected"),
            "first_culprit_right_of_detected": rate(found, "right"),
            "leaf_right_of_detected": rate(found, "leaf_right"),
            "views_agree_of_detected": rate(found, "views_agree"),
            "line_right_of_detected": rate(found, "line_right"),
            "op_and_line_right": rate(cases, "op_and_line_right"),
            "refactors_op_and_line_right": rate(
                [r for r in cases if r.get("refactor")], "op_and_line_right"
            ),
            "views_name_first_op_of_detected": rate(found, "views_name_first_op"),
            "terminal_has_lead_of_detected": rate(found, "terminal_has_lead"),
            "aa_false_alarms": rate(aa, "false_alarm"),
            "free_failed": rate(free, "failed"),
            "free_outcomes": sorted(r["outcome"] for r in free),
            "aa_outcomes": sorted(r["outcome"] for r in aa),
            "wall_s": round(
                sum(
                    r["wall_s"]
                    for r in rows
                    if r["mode"] == mode and r.get("first_of_session", True)
                ),
                1,
            ),
        }
    return out


def _cell(text: Any, n: int = 90) -> str:
    s = " ".join(str(text or "").split()).replace("|", "\\|")
    return s if len(s) <= n else s[: n - 1] + "…"


def markdown(rows: list[dict[str, Any]], rates: dict[str, Any], meta: dict[str, Any]) -> str:
    """The table and the numbers, as ``benchmarks/README.md`` shows them."""
    modes = sorted({r["mode"] for r in rows}, key=["store", "ab"].index)
    head = "| case | category | test | " + " | ".join(f"{m}: outcome, first culprit" for m in modes)
    out = [head + " |", "|---|---|---|" + "---|" * len(modes)]
    by_case: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == "case":
            by_case.setdefault(r["case"], {})[r["mode"]] = r
    for name, per in by_case.items():
        any_row = next(iter(per.values()))
        cells = []
        for m in modes:
            r = per.get(m)
            if r is None:
                cells.append("")
                continue
            mark = "" if r.get("right_and_detected") else " **wrong**"
            if r.get("right_and_detected") and not r.get("line_right"):
                mark = " **line wrong**"
            agree = "" if r.get("views_agree") or not r.get("detected") else " (views differ)"
            op = (
                f" {r.get('first_kind', '')} `{_cell(r.get('first_op'), 60)}`"
                if r.get("first_op")
                else ""
            )
            cells.append(f"{r['outcome']}:{op}{mark}{agree}")
        out.append(
            f"| {name} | {any_row['category']} | {any_row['test']} | " + " | ".join(cells) + " |"
        )
    out += [
        "",
        "| mode | cases | detected | first culprit right | of detected | op and line "
        "right | refactors: op and line right | views agree (of detected) | A/A false "
        "alarms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, t in rates.items():
        out.append(
            f"| {mode} | {t['cases']} | {t['detected']} | {t['first_culprit_right']} | "
            f"{t['first_culprit_right_of_detected']} | {t.get('op_and_line_right')} | "
            f"{t.get('refactors_op_and_line_right')} | {t['views_agree_of_detected']} | "
            f"{t['aa_false_alarms']} |"
        )
    out += [
        "",
        f"Load: before `{meta['uptime_before']}`; after `{meta['uptime_after']}`; "
        f"duration {meta['duration_s']:.0f} s.",
    ]
    wrong = [r for r in rows if r["kind"] == "case" and not r.get("op_and_line_right")]
    if wrong:
        out += ["", "Wrong or missing first culprits or lines (the test's line in summary.md):", ""]
        for r in wrong:
            said = r.get("summary_line") or r.get("lead") or r.get("headline")
            out.append(f"- {r['case']} ({r['mode']}, {r['outcome']}): {_cell(said, 400)}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def write_outputs(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """``culprits.json`` and ``culprits.md`` from the session rows."""
    rates = tally(rows)
    doc = {"meta": meta, "rates": rates, "rows": rows}
    (out / "culprits.json").write_text(json.dumps(doc, indent=1))
    (out / "culprits.md").write_text(markdown(rows, rates, meta))
    print(json.dumps(rates, indent=1))


def retally(out: Path) -> int:
    """Recount an earlier run's rows (``--retally``): no session is run again."""
    doc = json.loads((out / "culprits.json").read_text())
    write_outputs(out, doc["rows"], doc["meta"])
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--cases",
        default="all",
        help="comma-separated case names, all, or refactors: "
        f"{', '.join(c.name for c in (*CASES, *REFACTORS))}; free: the costless catalogue",
    )
    p.add_argument("--modes", default="store,ab", help="store, ab or both (default store,ab)")
    p.add_argument(
        "--project",
        choices=("torch", "frameworks"),
        default="torch",
        help="torch: six torch models (default); frameworks: Keras and JAX models, issue "
        "50's catalogue (framework_project.py)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer iterations and rounds, 3 A/B pairs, one A/A session per mode",
    )
    p.add_argument("--pairs", type=int, default=4, help="--perfguard-ab-pairs (default 4)")
    p.add_argument("--aa", type=int, default=2, help="A/A sessions per mode (default 2)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "culprits")
    p.add_argument("--keep", action="store_true", help="keep the temp project and its store")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per session")
    p.add_argument("--retally", action="store_true", help="recount OUT/culprits.json, run nothing")
    a = p.parse_args(argv)
    if a.retally:
        return retally(a.out.resolve())

    torch_project = a.project == "torch"
    every = (*CASES, *REFACTORS, *FREE) if torch_project else FRAMEWORK_CASES
    asked = a.cases.split(",")
    groups = {
        "all": [*CASES, *REFACTORS] if torch_project else list(FRAMEWORK_CASES),
        "refactors": list(REFACTORS) if torch_project else [],
        "free": list(FREE) if torch_project else [],
        "both": [*CASES, *REFACTORS, *FREE] if torch_project else list(FRAMEWORK_CASES),
    }
    suite, all_tests = (project, TESTS) if torch_project else (frameworks, FRAMEWORK_TESTS)
    chosen = groups.get(a.cases) or [c for c in every if c.name in asked]
    unknown = set(asked) - {c.name for c in every} - set(groups)
    if unknown:
        p.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    modes = [m for m in a.modes.split(",") if m]
    if set(modes) - {"store", "ab"}:
        p.error("--modes takes store and/or ab")
    iterations, rounds, warmup = (5, 3, 2) if a.quick else (10, 5, 3)
    pairs = min(a.pairs, 3) if a.quick else a.pairs
    aa_runs = min(a.aa, 1) if a.quick else a.aa

    a.out = a.out.resolve()  # the sessions run in the project's folder
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "sessions.jsonl"
    log.write_text("")
    tmp = Path(tempfile.mkdtemp(prefix="perfguard-culprits-"))
    t_start, before = time.monotonic(), uptime()
    print(f"culprits: project in {tmp}; load {before}", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        proj = Project(tmp, iterations, rounds, warmup, suite)
        imported = check_import(proj.dir)
        for c in chosen:
            proj.commit(c.name, c.what, c.edits)
        doc = next(iter(suite.files(1, 1, 1).values())).split("\n", 1)[0] + "\n"
        aa_sha = proj.commit(
            "aa",
            "A/A: only a comment changes",
            (Edit(suite.MODELS_FILE, doc, doc + "# reviewed\n"),),
        )
        proj.checkout(proj.base)
        saved = run_session(
            proj, ["--perfguard-save"], a.out / "sessions" / "base-save", list(all_tests), a.timeout
        )
        print(f"  base saved in {saved['wall_s']} s (exit {saved['returncode']})", flush=True)
        if saved["returncode"] != 0:
            raise SystemExit(f"culprits: saving the baseline failed:\n{saved['stdout'][-3000:]}")
        mode_args = {
            "store": [f"--perfguard-baseline={proj.base}"],
            "ab": [f"--perfguard-against={proj.base}", f"--perfguard-ab-pairs={pairs}"],
        }
        plan: list[tuple[str, Case | None, int]] = [(m, c, 0) for m in modes for c in chosen] + [
            (m, None, i) for m in modes for i in range(aa_runs)
        ]
        for mode, case, i in plan:
            name = case.name if case else f"aa{i}"
            proj.checkout(proj.commits[case.name] if case else aa_sha)
            tests = [case.test] if case else list(all_tests)
            session = run_session(
                proj, mode_args[mode], a.out / "sessions" / f"{name}-{mode}", tests, a.timeout
            )
            for j, test in enumerate(tests):
                kind = "aa" if case is None else ("free" if case in FREE else "case")
                row = {
                    "case": name,
                    "kind": kind,
                    "mode": mode,
                    "category": case.category if case else "A/A",
                    "what": case.what if case else "a comment",
                    "expected": list(case.expected) if case else [],
                    "load": session["load"],
                    "first_of_session": j == 0,
                    "refactor": case in REFACTORS if case else False,
                    **judge_case(case, test, session, proj.lines.get(case.name) if case else None),
                }
                rows.append(row)
                with log.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                mark = "" if case is None else (" right" if row.get("right") else " WRONG")
                print(
                    f"  {mode:5} {name:18} {test:28} {row['outcome']:11}{mark} "
                    f"{_cell(row.get('first_op'), 60)}  ({session['wall_s']} s)",
                    flush=True,
                )
    finally:
        if a.keep:
            print(f"culprits: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = {
        "date": now(),
        "uptime_before": before,
        "uptime_after": uptime(),
        "duration_s": round(time.monotonic() - t_start, 1),
        "perfguard": imported,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "settings": {
            "project": a.project,
            "iterations": iterations,
            "rounds": rounds,
            "warmup": warmup,
            "ab_pairs": pairs,
            "aa_sessions_per_mode": aa_runs,
            "modes": modes,
            "quick": a.quick,
        },
        "cases": [asdict(c) for c in chosen],
    }
    write_outputs(a.out, rows, meta)
    print(
        f"culprits: {meta['duration_s']:.0f} s; load after {meta['uptime_after']}; "
        f"results in {a.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
