"""XLA's HLO module, as the JAX/TF profiler stores it in an XSpace, read without XLA.

The ``/host:metadata`` plane of a JAX (and TF/XLA) profile holds one event metadata
per compiled program with an ``Hlo Proto`` stat: the serialized ``xla.HloProto``
(public schema: ``xla/service/hlo.proto``, ``xla/xla_data.proto``). Only the fields
read here are declared, as data, like :mod:`perfguard.trace.xspace_proto`: the
instructions' names, opcodes, shapes, operands, called computations, dot and
convolution dimensions, and their source metadata (the user's ``file:line``, from the
module's stack frame index: JAX keeps the user's frames there).

From them :func:`instruction_costs` gives each top-level instruction of the entry
computation (what the profiler names ``<module>::<instruction>``) its FLOPs, counted
as XLA's cost analysis counts the work that dominates it: a ``dot`` 2 x output
elements x contracted size, a ``convolution`` 2 x output elements x kernel window x
input features per group, summed through fusions and called computations; and its
source line. Elementwise FLOPs (XLA counts one per element) are left out, and the
closing note of a capture compares the sum with the module's cost analysis.
"""

from __future__ import annotations

import math
import re
from functools import cache
from typing import Any

import numpy as np
import pandas as pd

from perfguard.trace.call_sites import is_library_file, site_text

_I64, _STR, _MSG, _BOOL, _I32 = "int64", "string", "message", "bool", "int32"
_REP, _OPT = "repeated", "optional"
_MESSAGES: list[tuple[str, list[tuple[str, int, str, str, str | None]]]] = [
    (
        "ShapeProto",
        [
            ("element_type", 2, _I32, _OPT, None),
            ("dimensions", 3, _I64, _REP, None),
            ("tuple_shapes", 4, _MSG, _REP, "ShapeProto"),
        ],
    ),
    (
        "OpMetadata",
        [
            ("op_type", 1, _STR, _OPT, None),
            ("op_name", 2, _STR, _OPT, None),
            ("source_file", 3, _STR, _OPT, None),
            ("source_line", 4, _I32, _OPT, None),
            ("stack_frame_id", 15, _I32, _OPT, None),
        ],
    ),
    (
        "FileLocation",
        [
            ("file_name_id", 1, _I32, _OPT, None),
            ("function_name_id", 2, _I32, _OPT, None),
            ("line", 3, _I32, _OPT, None),
        ],
    ),
    (
        "StackFrame",
        [
            ("file_location_id", 1, _I32, _OPT, None),
            ("parent_frame_id", 2, _I32, _OPT, None),
        ],
    ),
    (
        "StackFrameIndexProto",
        [
            ("file_names", 1, _STR, _REP, None),
            ("function_names", 2, _STR, _REP, None),
            ("file_locations", 3, _MSG, _REP, "FileLocation"),
            ("stack_frames", 4, _MSG, _REP, "StackFrame"),
        ],
    ),
    (
        "DotDimensionNumbers",
        [
            ("lhs_contracting_dimensions", 1, _I64, _REP, None),
            ("rhs_contracting_dimensions", 2, _I64, _REP, None),
        ],
    ),
    ("WindowDimension", [("size", 1, _I64, _OPT, None)]),
    ("Window", [("dimensions", 1, _MSG, _REP, "WindowDimension")]),
    (
        "ConvolutionDimensionNumbers",
        [
            ("input_feature_dimension", 2, _I64, _OPT, None),
            ("kernel_input_feature_dimension", 3, _I64, _OPT, None),
        ],
    ),
    (
        "HloInstructionProto",
        [
            ("name", 1, _STR, _OPT, None),
            ("opcode", 2, _STR, _OPT, None),
            ("shape", 3, _MSG, _OPT, "ShapeProto"),
            ("metadata", 7, _MSG, _OPT, "OpMetadata"),
            ("window", 15, _MSG, _OPT, "Window"),
            ("convolution_dimension_numbers", 16, _MSG, _OPT, "ConvolutionDimensionNumbers"),
            ("dot_dimension_numbers", 30, _MSG, _OPT, "DotDimensionNumbers"),
            ("id", 35, _I64, _OPT, None),
            ("operand_ids", 36, _I64, _REP, None),
            ("called_computation_ids", 38, _I64, _REP, None),
            ("feature_group_count", 50, _I64, _OPT, None),
        ],
    ),
    (
        "HloComputationProto",
        [
            ("name", 1, _STR, _OPT, None),
            ("instructions", 2, _MSG, _REP, "HloInstructionProto"),
            ("id", 5, _I64, _OPT, None),
            ("root_id", 6, _I64, _OPT, None),
        ],
    ),
    (
        "HloModuleProto",
        [
            ("name", 1, _STR, _OPT, None),
            ("entry_computation_name", 2, _STR, _OPT, None),
            ("computations", 3, _MSG, _REP, "HloComputationProto"),
            ("entry_computation_id", 6, _I64, _OPT, None),
            ("stack_frame_index", 17, _MSG, _OPT, "StackFrameIndexProto"),
        ],
    ),
    ("HloProto", [("hlo_module", 1, _MSG, _OPT, "HloModuleProto")]),
]
_PACKAGE = "perfguard.hlo"
#: a program's event metadata name on the metadata plane: ``jit_step(6)``
_PROGRAM = re.compile(r"^(.*)\((\d+)\)$")
#: opcodes that move or name data without computing: left out of what a fusion holds
_PLUMBING = frozenset(
    ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "broadcast", "reshape")
)
#: an instruction's FLOPs, its source line and the opcodes it holds (:func:`instruction_costs`)
Cost = tuple[float, str | None, tuple[str, ...]]


@cache
def hlo_proto_class() -> Any:
    """The ``HloProto`` message class (built once per process)."""
    # protobuf: loaded only when an XSpace is read, not by every trace reader
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(
        name="perfguard/hlo.proto", package=_PACKAGE, syntax="proto3"
    )
    fd = descriptor_pb2.FieldDescriptorProto
    for msg_name, fields in _MESSAGES:
        msg = fdp.message_type.add(name=msg_name)
        for name, number, ftype, label, ref in fields:
            f = msg.field.add(name=name, number=number, json_name=name)
            f.type = getattr(fd, f"TYPE_{ftype.upper()}")
            f.label = fd.LABEL_REPEATED if label == _REP else fd.LABEL_OPTIONAL
            if ref:
                f.type_name = f".{_PACKAGE}.{ref}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.HloProto"))


def instruction_costs(blob: bytes) -> tuple[str, dict[str, Cost]]:
    """``(module name, {instruction name: (FLOPs, "file:line" or None, held)})`` for the
    top-level instructions of the entry computation of a serialized ``HloProto``; ``held``:
    the opcodes a fusion (or call) runs, in order, without :data:`_PLUMBING`, so a report
    can say what ``fusion.3`` or XLA:CPU's ``ynn_fusion`` is: ``dot, add, maximum``."""
    proto = hlo_proto_class()()
    proto.ParseFromString(blob)
    module = proto.hlo_module
    comps = {c.id: c for c in module.computations}
    # operands by id within their computation (ids need not be unique across them)
    local = {c.id: {i.id: i for i in c.instructions} for c in module.computations}
    memo: dict[int, float] = {}

    def comp_flops(cid: int, depth: int = 0) -> float:
        if cid in memo:
            return memo[cid]
        comp = comps.get(cid)
        total = 0.0
        if comp is not None and depth < 64:
            total = sum(own_flops(i, local[cid], depth + 1) for i in comp.instructions)
        memo[cid] = total
        return total

    def own_flops(ins: Any, by_id: dict[int, Any], depth: int) -> float:
        flops = _dot_or_conv(ins, by_id)
        return flops + sum(comp_flops(c, depth) for c in ins.called_computation_ids)

    entry = comps.get(module.entry_computation_id)
    if entry is None:
        entry = next(
            (c for c in module.computations if c.name == module.entry_computation_name), None
        )

    frames = module.stack_frame_index

    def user_frame(frame_id: int) -> str | None:
        """The innermost frame of the stack ``frame_id`` (1-based) in the user's code."""
        for _ in range(64):
            if not 0 < frame_id <= len(frames.stack_frames):
                return None
            frame = frames.stack_frames[frame_id - 1]
            loc_id = frame.file_location_id
            if 0 < loc_id <= len(frames.file_locations):
                loc = frames.file_locations[loc_id - 1]
                if 0 < loc.file_name_id <= len(frames.file_names):
                    file = frames.file_names[loc.file_name_id - 1]
                    if not is_library_file(file):
                        return site_text(file, loc.line)
            frame_id = frame.parent_frame_id
        return None

    def site_of(ins: Any, depth: int = 0) -> str | None:
        """The instruction's source line, else the first one inside what it calls
        (a fusion's own metadata is often empty; its dot's names the user's line)."""
        md = ins.metadata
        if md.source_file and not is_library_file(md.source_file):
            return site_text(md.source_file, md.source_line)
        if md.stack_frame_id:
            found = user_frame(md.stack_frame_id)
            if found:
                return found
        for cid in ins.called_computation_ids if depth < 8 else ():
            for inner in comps[cid].instructions if cid in comps else ():
                found = site_of(inner, depth + 1)
                if found:
                    return found
        return None

    def held(cid: int, found: dict[str, None], depth: int = 0) -> None:
        """The opcodes computation ``cid`` runs, through what it calls, in order."""
        for inner in comps[cid].instructions if cid in comps and depth < 16 else ():
            if inner.opcode not in _PLUMBING:
                found.setdefault(inner.opcode, None)
            for c in inner.called_computation_ids:
                held(c, found, depth + 1)

    out: dict[str, Cost] = {}
    if entry is not None:
        for ins in entry.instructions:
            inside: dict[str, None] = {}
            for cid in ins.called_computation_ids:
                held(cid, inside)
            out[ins.name] = (own_flops(ins, local[entry.id], 0), site_of(ins), tuple(inside))
    return module.name, out


def _elements(shape: Any) -> float:
    return float(math.prod(shape.dimensions)) if len(shape.dimensions) else 1.0


def _dot_or_conv(ins: Any, by_id: dict[int, Any]) -> float:
    if ins.opcode == "dot":
        lhs = by_id.get(ins.operand_ids[0]) if len(ins.operand_ids) else None
        if lhs is None:
            return 0.0
        dims = lhs.shape.dimensions
        k = math.prod(
            dims[d] for d in ins.dot_dimension_numbers.lhs_contracting_dimensions if d < len(dims)
        )
        return 2.0 * _elements(ins.shape) * float(k)
    if ins.opcode == "convolution":
        if len(ins.operand_ids) < 2:
            return 0.0
        kernel = by_id.get(ins.operand_ids[1])
        if kernel is None:
            return 0.0
        window = math.prod(d.size for d in ins.window.dimensions) if ins.window.dimensions else 1
        kd = ins.convolution_dimension_numbers.kernel_input_feature_dimension
        cin = kernel.shape.dimensions[kd] if kd < len(kernel.shape.dimensions) else 1
        return 2.0 * _elements(ins.shape) * float(window) * float(cin)
    return 0.0


def space_costs(space: Any, ran: set[tuple[str, int]] | None = None) -> dict[str, dict[str, Cost]]:
    """Per HLO module name, :func:`instruction_costs` of the program of that name that
    ran in the capture (``ran``: ``(module, program id)`` pairs of the host's HLO op
    events; the metadata plane lists every program the process loaded, named
    ``<module>(<program id>)``, and many share a name: ``jit__lambda``). A module
    name two programs of the capture share (one function run at two shapes) gets no
    FLOPs: the op names cannot tell them apart."""
    found: dict[str, list[dict[str, Cost]]] = {}
    for plane in space.planes:
        if plane.name != "/host:metadata":
            continue
        names = {e.key: e.value.name for e in plane.stat_metadata}
        for entry in plane.event_metadata:
            m = _PROGRAM.match(entry.value.name)
            if ran is not None and (m is None or (m.group(1), int(m.group(2))) not in ran):
                continue
            for stat in entry.value.stats:
                if names.get(stat.metadata_id) != "Hlo Proto" or not stat.bytes_value:
                    continue
                try:
                    module, costs = instruction_costs(stat.bytes_value)
                except Exception:  # noqa: BLE001 - a proto we cannot read: no FLOPs for it
                    continue
                found.setdefault(module, []).append(costs)
    return {module: c[0] for module, c in found.items() if len(c) == 1}


def range_costs(names: Any, costs: dict[str, dict[str, Cost]]) -> tuple[Any, Any, Any]:
    """``(flops, call site, held)`` arrays for ranges named ``<module>::<instruction>``
    (NaN / None where the module's HLO is not in the capture; ``held`` the text
    ``dot, add, maximum``, None where the op calls nothing), once per distinct name."""
    codes, uniques = pd.factorize(pd.Series(names, dtype=object))
    flops = np.full(len(uniques), np.nan)
    sites = np.full(len(uniques), None, dtype=object)
    held = np.full(len(uniques), None, dtype=object)
    for i, u in enumerate(uniques):
        module, sep, op = str(u).partition("::")
        hit = costs.get(module, {}).get(op) if sep else None
        if hit is not None:
            flops[i], sites[i] = hit[0], hit[1]
            held[i] = ", ".join(hit[2]) or None
    ok = codes >= 0
    f = np.full(len(codes), np.nan)
    s = np.full(len(codes), None, dtype=object)
    h = np.full(len(codes), None, dtype=object)
    f[ok], s[ok], h[ok] = flops[codes[ok]], sites[codes[ok]], held[codes[ok]]
    return f, s, h
