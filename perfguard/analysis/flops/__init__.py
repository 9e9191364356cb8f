"""FLOPs and DRAM bytes per framework op, from its recorded shapes, dtypes and scalar arguments.

Facts and formulas come from ``shared/reference/tensor_cores_flops.md`` ("the reference"), §0
and §3; each family module names its sources. Conventions (reference §0):

* **1 FMA = 2 FLOPs**; algorithmic FLOPs, not executed ones (Winograd, padding tiles, split-K
  and recompute do not change the count). Bias, scale and softmax work inside a GEMM,
  convolution or attention is not counted there (flop_counter convention).
* **Unknown is NA, never 0 and never a guess.** A shape, dtype or scalar argument that the
  capture did not record (legacy Kineto has no ``Concrete Inputs``, so a forward convolution's
  stride is unknown) makes the figure NA, with the reason in ``flop_formula``.
* **Causal attention counts half** the score/value work (the FlashAttention benchmark convention,
  reference §3.6). ``FlopCounterMode`` does not halve; the formula text says ``causal x1/2``.
* **FP32 is reported as ``fp32``**: whether a GEMM ran as TF32 is a kernel property (Tensor-Core
  kernel with fp32 operands), decided by the caller when it picks the peak
  (:func:`perfguard.analysis.peaks.peak_flops` with ``tensor_core=True`` gives the TF32 peak).
* **Bytes** are compulsory DRAM traffic (reference §3): each input read once, each output
  written once; real kernels can move more or less. Each family module states its byte model.

Modules, one concern each: ``dtypes`` (element sizes, compute dtypes, ``ScalarType`` codes),
``core`` (:class:`OpCost`, the parsed arguments, the registry and :func:`op_cost`), one module
per op family (``gemm``, ``conv``, ``attention``, ``pointwise``, ``reductions`` with softmax,
``norms``, ``embedding``, ``optimizers``, ``copies``), and ``frames`` (:func:`op_flops` over a
DataFrame, :func:`count_once` and :data:`LEAF_POLICY`).

Adding an op is one decorated function, or one ``formula(...)`` line over a shared one, in its
family's module: ``@formula("aten::mm")`` registers it in :data:`FORMULAS` (key: the aten op
name without ``aten::``); a name registered twice fails at import.
"""

from __future__ import annotations

# the family modules register their formulas as they are imported
from perfguard.analysis.flops import (  # noqa: F401
    attention,
    conv,
    copies,
    embedding,
    gemm,
    norms,
    optimizers,
    pointwise,
    reductions,
)
from perfguard.analysis.flops.attention import AttnSpec
from perfguard.analysis.flops.conv import ConvBwdSpec, ConvSpec
from perfguard.analysis.flops.core import CONTRACTION_FAMILIES, FORMULAS, OpCost, op_cost
from perfguard.analysis.flops.dtypes import COMPUTE_DTYPE, ELEMENT_SIZE
from perfguard.analysis.flops.frames import LEAF_POLICY, count_once, op_flops

# the names the argument-position test (tests/test_flops.py) reads the specs by
_ConvSpec, _ConvBwdSpec, _AttnSpec = ConvSpec, ConvBwdSpec, AttnSpec

__all__ = [
    "COMPUTE_DTYPE",
    "CONTRACTION_FAMILIES",
    "ELEMENT_SIZE",
    "FORMULAS",
    "LEAF_POLICY",
    "OpCost",
    "count_once",
    "op_cost",
    "op_flops",
]
