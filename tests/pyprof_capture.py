"""A PyProf / DLProf capture of one fp16 training step of a small CNN, as nsys exports it.

The NVTX texts are built the way ``pyprof/nvtx/nvmarker.py`` builds them:
``str()`` of Python dicts (trace marker, argument marker; DLProf adds
``funcStack``, ``callid`` and ``input_callids``), around autograd's own
``aten::..., seq = N`` ranges (``emit_nvtx``). The backward pass runs on the
autograd engine's thread with ``XBackward0, seq = N`` ranges. The kernel
names are real cuDNN/cuBLAS names for an H200 (the template export's GPU).

Model: ``conv2d(3->16, 3x3, pad 1)`` -> ``relu`` -> ``linear(16384 -> 10)`` on a
batch of 32 3x32x32 images, all fp16.
"""

from __future__ import annotations

from pathlib import Path

from nsys_builder import NsysBuilder

MAIN, BACKWARD = 4242, 4250
SITE_PREFIX = "/home/user/project/"
_TORCH = "/opt/conda/lib/python3.10/site-packages/torch/"


def _tensor(shape: tuple, dtype: str = "float16", name: str = "") -> dict:
    return {"name": name, "type": "tensor", "shape": shape, "dtype": dtype}


#: (op, PyProf module, args, user call site line, DLProf funcStack, torch frame, autograd ranges
#:  with their seq, kernels (name, duration ns))
FORWARD = [
    (
        "conv2d",
        "torch.nn.functional",
        [
            _tensor((32, 3, 32, 32)),
            _tensor((16, 3, 3, 3)),
            _tensor((16,)),
            {"name": "", "type": "tuple", "value": (1, 1)},
            {"name": "", "type": "tuple", "value": (1, 1)},
            {"name": "", "type": "tuple", "value": (1, 1)},
            {"name": "", "type": "int", "value": 1},
        ],
        12,
        "/Net::forward/Conv2d::forward/conv2d",
        "nn/modules/conv.py:456",
        [
            ("aten::conv2d", 12),
            ("aten::convolution", 12),
            ("aten::_convolution", 12),
            ("aten::cudnn_convolution", 12),
        ],
        [
            (
                "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x64x64_"
                "warpgroupsize1x1x1_g1_execute_kernel__5x_cudnn",
                21_000,
            )
        ],
    ),
    (
        "relu",
        "torch.nn.functional",
        [_tensor((32, 16, 32, 32)), {"name": "inplace", "type": "bool", "value": False}],
        13,
        "/Net::forward/relu",
        "nn/functional.py:1471",
        [("aten::relu", 13), ("aten::clamp_min", 13)],
        [
            (
                "void at::native::vectorized_elementwise_kernel<4, "
                "at::native::(anonymous namespace)::clamp_min_scalar_kernel_impl, "
                "std::array<char*, 2ul> >(int, T2, T3)",
                6_000,
            )
        ],
    ),
    (
        "linear",
        "torch.nn.functional",
        [_tensor((32, 16384)), _tensor((10, 16384)), _tensor((10,))],
        15,
        "/Net::forward/Linear::forward/linear",
        "nn/modules/linear.py:116",
        [("aten::linear", 15), ("aten::addmm", 15)],
        [("nvjet_hsh_64x8_64x16_4x1_v_bz_TNT", 9_000)],
    ),
]
#: backward nodes: (node, seq, inner aten op, kernels)
BACKWARD_NODES = [
    (
        "AddmmBackward0",
        15,
        "aten::mm",
        [
            ("nvjet_hsh_64x8_64x16_4x1_v_bz_TNN", 8_000),
            ("nvjet_hsh_64x64_64x16_2x1_v_bz_NTN", 9_000),
        ],
    ),
    (
        "ReluBackward0",
        13,
        "aten::threshold_backward",
        [
            (
                "void at::native::vectorized_elementwise_kernel<4, "
                "at::native::(anonymous namespace)::threshold_kernel_impl, "
                "std::array<char*, 3ul> >(int, T2, T3)",
                7_000,
            )
        ],
    ),
    (
        "ConvolutionBackward0",
        12,
        "aten::convolution_backward",
        [
            (
                "sm90_xmma_dgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nchw_tilesize128x64x64_"
                "warpgroupsize1x1x1_g1_execute_kernel__5x_cudnn",
                25_000,
            ),
            (
                "sm90_xmma_wgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x64x64_"
                "warpgroupsize1x1x1_g1_execute_kernel__5x_cudnn",
                30_000,
            ),
        ],
    ),
]
#: the user's line that called each op (model.py line of FORWARD's entry)
CALL_SITES = {
    "conv2d": f"{SITE_PREFIX}model.py:12",
    "relu": f"{SITE_PREFIX}model.py:13",
    "linear": f"{SITE_PREFIX}model.py:15",
}


def _stack(op: str, torch_frame: str) -> list[str]:
    """What ``traceback.extract_stack()`` gives inside the wrapper, outermost first."""
    return [
        "/usr/lib/python3.10/runpy.py:196",
        f"{SITE_PREFIX}train.py:34",
        f"{_TORCH}nn/modules/module.py:1501",
        CALL_SITES[op],
        f"{_TORCH}{torch_frame}",
    ]


def _nest(b: NsysBuilder, t0: int, names: list[str], tid: int, kernels: list, gpu_t: int) -> int:
    """Ranges ``names`` nested from ``t0`` (outermost first), the kernels launched in the
    innermost; returns the end of the outermost range and the next free GPU time."""
    depth = len(names)
    body = 30_000 * len(kernels)
    for i, name in enumerate(names):
        b.range(t0 + 2_000 * i, t0 + 2_000 * (2 * depth - i) + body, name, tid)
    t = t0 + 2_000 * depth
    for kernel, dur in kernels:
        b.launch((t + 5_000, t + 12_000), (gpu_t, gpu_t + dur), kernel, tid)
        gpu_t += dur + 3_000
        t += 30_000
    return t0 + 2_000 * 2 * depth + body, gpu_t


def build(template: Path, dest: Path, dlprof: bool = False) -> Path:
    """Write the capture; ``dlprof`` writes DLProf's marker fields as well."""
    b = NsysBuilder(template, dest, pid=MAIN)
    b.thread(MAIN, "python")
    b.thread(BACKWARD, "pt_autograd_0")
    t, gpu_t = 1_000_000_000, 1_000_050_000
    for callid, (op, mod, args, _line, stack, frame, aten, kernels) in enumerate(FORWARD):
        trace = {"traceMarker": _stack(op, frame)}
        marker = {"mod": mod, "op": op}
        if dlprof:
            trace["funcStack"] = stack
            marker.update({"callid": callid, "input_callids": [callid - 1] if callid else []})
        marker["args"] = args
        names = [str(trace), str(marker)] + [f"{a}, seq = {s}" for a, s in aten]
        end, gpu_t = _nest(b, t, names, MAIN, kernels, gpu_t)
        t = end + 10_000
    t += 50_000
    for node, seq, inner, kernels in BACKWARD_NODES:
        end, gpu_t = _nest(b, t, [f"{node}, seq = {seq}", inner], BACKWARD, kernels, gpu_t)
        t = end + 10_000
    return b.close()
