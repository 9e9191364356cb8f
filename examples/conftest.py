"""Shared fixtures for the example benchmarks: copy this next to your own.

``device`` picks CUDA when there is a GPU and the CPU otherwise, so the same
benchmark runs on a laptop, in CPU-only CI and on the GPU runner. Seeds and
a single intra-op thread on the CPU keep the per-iteration times steady
enough for perfguard's statistics (noise on a shared CPU runner is the
usual cause of a flaky verdict).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def device() -> str:
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True  # let fp32 GEMMs use Tensor Cores
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        return "cuda"
    torch.set_num_threads(1)
    return "cpu"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
