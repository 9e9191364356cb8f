"""The training and inference code the acceptance run profiles (issue 44): what people
point perfguard at, built from configs with random weights (nothing is downloaded).

* a decoder-only LM, Hugging Face ``transformers``' Llama from a config: a training step
  (bf16 autocast, fused AdamW, SDPA attention) and an inference forward;
* a CNN training step in channels-last: torchvision's ResNet, else timm's, else the
  ResNet-style network below (torchvision's wheel does not import on every CPU machine);
  :data:`CNN_SOURCE` says which one ran;
* a transformer block under ``torch.compile``, Inductor's default mode and
  ``reduce-overhead`` (CUDA graphs).

Each ``*_step`` builds its model and returns the step the test's loop calls, so the run's
probe (``benchmarks/acceptance_probe.py``) counts the FLOPs of the same step. Sizes follow
the device: the GPU's are a small real model; the CPU's (the run's dry mode) keep every
code path at a few milliseconds a step. The run's injected changes are text edits of this
file (``gpu_acceptance.MODEL_CHANGES``): keep the lines they name as they are.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

Step = Callable[[], torch.Tensor]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Size:
    """One device's model sizes and loop lengths."""

    lm_layers: int
    lm_hidden: int
    lm_ffn: int
    lm_heads: int
    lm_kv_heads: int
    vocab: int
    batch: int
    seq: int
    cnn_arch: str  # resnet18 | resnet50
    cnn_widths: tuple[int, ...]  # the local network's stage widths
    cnn_batch: int
    image: int
    block_dim: int
    block_tokens: int
    iterations: int
    warmup: int


SIZES = {
    "cuda": Size(
        lm_layers=4,
        lm_hidden=1024,
        lm_ffn=2816,
        lm_heads=16,
        lm_kv_heads=4,
        vocab=32000,
        batch=8,
        seq=512,
        cnn_arch="resnet50",
        cnn_widths=(64, 128, 256, 512),
        cnn_batch=32,
        image=224,
        block_dim=1024,
        block_tokens=2048,
        iterations=4,
        warmup=3,
    ),
    "cpu": Size(
        lm_layers=2,
        lm_hidden=64,
        lm_ffn=172,
        lm_heads=4,
        lm_kv_heads=2,
        vocab=256,
        batch=2,
        seq=32,
        cnn_arch="resnet18",
        cnn_widths=(8, 16, 32, 64),
        cnn_batch=2,
        image=32,
        block_dim=64,
        block_tokens=64,
        iterations=3,
        warmup=1,
    ),
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SIZE = SIZES[DEVICE]
#: bf16 autocast on both devices: the CPU's dry run takes the GPU's code path
AMP = torch.bfloat16
#: the compiled block's tests run it under torch.compile
COMPILE = True
#: which CNN implementation ran (set by :func:`build_cnn`)
CNN_SOURCE = ""


# ---------------------------------------------------------------------- the language model
def build_lm(device: str) -> nn.Module:
    """A Llama (RMSNorm, rotary, grouped-query SDPA attention, SwiGLU) with random weights."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    s = SIZE
    config = LlamaConfig(
        vocab_size=s.vocab,
        hidden_size=s.lm_hidden,
        intermediate_size=s.lm_ffn,
        num_hidden_layers=s.lm_layers,
        num_attention_heads=s.lm_heads,
        num_key_value_heads=s.lm_kv_heads,
        max_position_embeddings=s.seq,
        use_cache=False,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(device)


def lm_batch(device: str) -> torch.Tensor:
    return torch.randint(0, SIZE.vocab, (SIZE.batch, SIZE.seq), device=device)


def lm_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)


def lm_train_step(device: str) -> Step:
    """Forward with the labels (the loss inside the model), backward, AdamW, under bf16."""
    model = build_lm(device).train()
    opt = lm_optimizer(model)
    ids = lm_batch(device)

    def step() -> torch.Tensor:
        with torch.autocast(device, dtype=AMP):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def lm_forward_step(device: str) -> Step:
    """An inference forward of the same model (the logits of a batch), under bf16."""
    model = build_lm(device).eval()
    ids = lm_batch(device)

    def step() -> torch.Tensor:
        with torch.inference_mode(), torch.autocast(device, dtype=AMP):
            return model(input_ids=ids).logits

    return step


# ---------------------------------------------------------------------- the CNN
class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (ResNet-18's block)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.down(x))


class ResNet(nn.Module):
    """A ResNet-18-style network (stem, four stages of two blocks, pooled classifier): the
    fallback where neither torchvision nor timm imports."""

    def __init__(self, widths: tuple[int, ...], classes: int = 1000) -> None:
        super().__init__()
        w0 = widths[0]
        self.stem = nn.Sequential(
            nn.Conv2d(3, w0, 7, 2, 3, bias=False),
            nn.BatchNorm2d(w0),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        stages, cin = [], w0
        for i, w in enumerate(widths):
            stages += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1))


def build_cnn() -> nn.Module:
    """torchvision's ResNet, else timm's, else :class:`ResNet`; :data:`CNN_SOURCE` says."""
    global CNN_SOURCE
    arch = SIZE.cnn_arch
    try:
        import torchvision

        CNN_SOURCE = f"torchvision {torchvision.__version__} {arch}"
        return getattr(torchvision.models, arch)(weights=None)
    except Exception:  # noqa: BLE001 (a wheel that does not import: the next source)
        pass
    try:
        import timm

        CNN_SOURCE = f"timm {timm.__version__} {arch}"
        return timm.create_model(arch, pretrained=False)
    except Exception:  # noqa: BLE001
        pass
    CNN_SOURCE = f"local ResNet-18-style, widths {SIZE.cnn_widths}"
    return ResNet(SIZE.cnn_widths)


def cnn_train_step(device: str) -> Step:
    """Forward, cross-entropy, backward and SGD with momentum, channels-last, under bf16."""
    model = build_cnn().to(device, memory_format=torch.channels_last).train()
    log.info("CNN: %s", CNN_SOURCE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    images = torch.randn(SIZE.cnn_batch, 3, SIZE.image, SIZE.image, device=device)
    images = images.to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (SIZE.cnn_batch,), device=device)

    def step() -> torch.Tensor:
        with torch.autocast(device, dtype=AMP):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


# ---------------------------------------------------------------------- the compiled block
class Block(nn.Module):
    """A pre-norm transformer block: RMSNorm, causal SDPA attention, SwiGLU MLP."""

    def __init__(self, d: int, heads: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.norm2 = nn.RMSNorm(d)
        self.gate_up = nn.Linear(d, 2 * 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def can_compile(device: str) -> str | None:
    """Why torch.compile cannot run here, or None: Inductor builds CPU kernels with a C++
    compiler."""
    if device == "cpu" and not (shutil.which("c++") or shutil.which("g++")):
        return "no C++ compiler: Inductor cannot build CPU kernels"
    return None


def compiled_block_step(device: str, mode: str, compile: bool = COMPILE) -> Step:
    """A block's bf16 forward under ``torch.compile(mode=mode)``; ``compile=False`` runs it
    eagerly (the probe counts its FLOPs that way: compiled kernels are no aten ops)."""
    block = Block(SIZE.block_dim).to(device).eval()
    fn = torch.compile(block, mode=mode) if compile else block
    x = torch.randn(SIZE.batch, SIZE.block_tokens // SIZE.batch, SIZE.block_dim, device=device)

    def step() -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()  # a new step for CUDA graph trees
        with torch.no_grad(), torch.autocast(device, dtype=AMP):
            return fn(x)

    return step


#: the tests' steps by test name, for the probe
STEPS: dict[str, Callable[[str], Step]] = {
    "test_lm_train_step": lm_train_step,
    "test_lm_forward": lm_forward_step,
    "test_cnn_train_step": cnn_train_step,
    "test_compiled_block": lambda device: compiled_block_step(device, "default"),
    "test_compiled_block_cudagraphs": lambda device: compiled_block_step(device, "reduce-overhead"),
}
