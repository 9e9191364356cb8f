"""Fixtures of the acceptance run's model project (``benchmarks/gpu_acceptance.py
--suite models`` copies this folder into a fresh git repository).

The settings a GPU training script usually has: TF32 for fp32 matmuls and cuDNN, cuDNN's
autotuner on; on the CPU (the run's dry mode) one intra-op thread, as the examples do.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def device() -> str:
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        return "cuda"
    torch.set_num_threads(1)
    return "cpu"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
