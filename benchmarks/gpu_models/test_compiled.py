"""A transformer block under torch.compile, Inductor's default mode and reduce-overhead
(CUDA graphs), under perfguard (``models.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import models  # noqa: E402

S = models.SIZE


def _run(gpuprofile, device: str, mode: str) -> None:
    why = models.can_compile(device)
    if why:
        pytest.skip(why)
    step = models.compiled_block_step(device, mode)
    for _ in gpuprofile.iterations():
        y = step()
    assert torch.isfinite(y.float()).all()


@pytest.mark.gpuprofile(iterations=4 * S.iterations, warmup=S.warmup, tolerance="5%")
def test_compiled_block(gpuprofile, device):
    _run(gpuprofile, device, "default")


@pytest.mark.gpuprofile(iterations=4 * S.iterations, warmup=S.warmup, tolerance="5%")
def test_compiled_block_cudagraphs(gpuprofile, device):
    if device != "cuda":
        pytest.skip("reduce-overhead is CUDA graphs: GPU only")
    _run(gpuprofile, device, "reduce-overhead")
