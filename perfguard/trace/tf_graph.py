"""The shapes and dtypes of TensorFlow graph ops, written beside a capture and tied to its ops.

TensorFlow's profiler records a graph op's node name and type, not its tensors (on TF 2.21's
CPU capture the op events carry only scheduling stats: ``_ct``, ``_c``, ``_p``, ``id``,
``iter_num``). The graphs know them: the capturer walks the ``tf.function`` graphs this process
traced when the capture stops (:func:`perfguard.capture.tensorflow.graph_facts`) and writes, per
node name, its type, each input's shape, dtype and producer node, each output's shape and the
attributes a cost needs (``transpose_a``, ``adj_x``, ``data_format``) to
``<capture>.tfgraph.json``. :func:`with_graph_facts` gives each TF op range the facts of its
node as JSON text (``tf_facts``), which :mod:`perfguard.analysis.flops.tensorflow` costs.

Grappler rewrites the graph it runs: a ``MatMul -> BiasAdd -> Relu`` chain runs as one
``_FusedMatMul`` (oneDNN: ``_MklNativeFusedMatMul``) named after the chain's last node
(``dense/Relu``); oneDNN runs ``Conv2D -> BiasAdd`` as ``_MklNativeConv2DWithBias`` named
``BiasAdd`` even with the remapper off. Where the op's runtime type does not name its node's
type, its facts carry the producer whose type it names (``core``: the ``MatMul`` a few inputs
up), whose shapes the contraction's cost needs, and the nodes between them (``chain``). Shapes
are the graph's static shapes: a dimension the trace left unknown (``None``, an
``input_signature`` with a free batch) makes the figure NA.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.trace.model import Trace
from perfguard.trace.tf_names import identity_of

GRAPH_SUFFIX = ".tfgraph.json"
GRAPH_VERSION = 1
#: how many inputs up a fused op's contraction is looked for (``Relu <- BiasAdd <- MatMul``)
_FUSED_DEPTH = 3
#: a function call node, the prefix of its body's ops' runtime names
_CALL_NODE = re.compile(r"^(?:Stateful)?PartitionedCall(?:_\d+)?$")


def graph_path(capture: Path) -> Path:
    return capture.with_name(capture.name + GRAPH_SUFFIX)


def write_graph_facts(capture: Path, functions: dict[str, dict[str, dict[str, Any]]]) -> Path:
    """``functions``: per traced function's name, per node name, the node's facts."""
    path = graph_path(capture)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    doc = {"version": GRAPH_VERSION, "functions": functions}
    tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)
    return path


def read_graph_facts(capture: Path, notes: list[str]) -> dict[str, dict[str, Any]] | None:
    """The facts beside ``capture`` by function; None (with a note when the file is
    damaged) else."""
    path = graph_path(capture)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if int(doc.get("version", 0)) > GRAPH_VERSION:
            raise ValueError(f"version {doc.get('version')} is newer than this perfguard's")
        functions = doc["functions"]
        if not isinstance(functions, dict) or not all(
            isinstance(v, dict) for v in functions.values()
        ):
            raise TypeError("'functions' is not an object of objects")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        notes.append(f"{path.name}: not read ({type(exc).__name__}: {exc}); no TF op FLOPs")
        return None
    return {str(k): v for k, v in functions.items()}


def with_graph_facts(path: Path, trace: Trace) -> Trace:
    """TF op ranges get ``tf_facts`` (JSON text, None where the graphs do not know the
    node: eager ops, the input pipeline's), from the file beside ``path``: the nodes of the
    functions the capture ran (``meta["tf_functions"]``; every function's where it names
    none) and of the functions they call, the first that has a name giving its facts. Reads
    the ranges' node names (``name`` before :func:`perfguard.trace.tf_names.op_identities`)."""
    functions = read_graph_facts(path, trace.notes)
    r = trace.ranges
    if not functions or r.empty:
        return trace
    ran = list(trace.meta.get("tf_functions") or functions)
    nodes: dict[str, dict[str, Any]] = {}
    for function in ran:  # grows with the functions they call (``fn``: model.fit's step)
        for node_name, facts in functions.get(function, {}).items():
            nodes.setdefault(node_name, facts)
            called = facts.get("fn")
            if isinstance(called, str) and called in functions and called not in ran:
                ran.append(called)
    canon = _by_identity(nodes)
    tf = (r["category"] == "tf_op").to_numpy(bool)
    node = r["name"].astype(object).to_numpy()
    kind = r["op_type"].astype(object).to_numpy()
    pairs = pd.Series([f"{n}\x1f{k}" for n, k in zip(node[tf], kind[tf], strict=True)])
    codes, uniques = pd.factorize(pairs)
    text = []
    for u in uniques:
        name, op_type = u.split("\x1f", 1)
        found = facts_of(name, op_type, nodes, canon)
        text.append(None if found is None else json.dumps(found, separators=(",", ":")))
    out = np.full(len(r), None, dtype=object)
    out[tf] = np.array([*text, None], dtype=object)[codes]
    r["tf_facts"] = pd.Series(out, index=r.index, dtype=object)
    return trace


def _by_identity(nodes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """The nodes by their identity (:mod:`perfguard.trace.tf_names`: no uniquifying
    ``_<n>``), None where two nodes share one: how an op is found when its runtime name
    and its traced node's differ only in those numbers (``model.fit``'s step ran
    ``sequential/dense/Relu``; its traced graph calls the node ``sequential_1/dense_1/Relu``)."""
    out: dict[str, dict[str, Any] | None] = {}
    for name, facts in nodes.items():
        key = identity_of(name)  # as :func:`_lookup` keys a runtime name
        out[key] = facts if key not in out else None
    return out


def _lookup(
    name: str,
    nodes: dict[str, dict[str, Any]],
    canon: dict[str, dict[str, Any] | None] | None = None,
) -> dict[str, Any] | None:
    """A node by its runtime name; ops of a called function run as ``<call node>/<name>``
    (``StatefulPartitionedCall/sgd/Mul``), so leading call nodes go until one is known; a
    name no node has exactly is looked up by its identity in ``canon`` (one node only)."""
    parts = name.split("/")
    for i in range(len(parts)):
        tail = "/".join(parts[i:])
        found = nodes.get(tail)
        if found is None and canon is not None:
            found = canon.get(identity_of(tail))
        if found is not None or not _CALL_NODE.match(parts[i]):
            return found
    return None


def facts_of(
    name: str,
    op_type: str,
    nodes: dict[str, dict[str, Any]],
    canon: dict[str, dict[str, Any] | None] | None = None,
) -> dict[str, Any] | None:
    """The facts of node ``name`` run as ``op_type``; for a fusion also ``core`` and
    ``chain``, each with its ``name`` (module doc)."""
    own = _lookup(name, nodes, canon)
    if own is None:
        return None
    out = dict(own)
    node_type = str(own.get("type", ""))
    if node_type not in op_type:
        found = _fusion(own, op_type, nodes)
        if found is not None:
            out["core"], out["chain"] = found
    return out


def _fusion(
    own: dict[str, Any], op_type: str, nodes: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The nearest producer whose type the fused ``op_type`` names (``MatMul`` in
    ``_FusedMatMul``, ``Conv2D`` in ``_MklNativeConv2DWithBias``), at most
    :data:`_FUSED_DEPTH` inputs up, and the nodes between it and ``own`` (``BiasAdd`` of
    ``MatMul -> BiasAdd -> Relu``), each with its name."""
    level: list[tuple[str, list[str]]] = [("", [])]  # (node name, the names below it)
    facts = {"": own}
    for _ in range(_FUSED_DEPTH):
        above = []
        for name, path in level:
            for src in facts[name].get("src") or ():
                node = nodes.get(str(src))
                if node is None:
                    continue
                facts[str(src)] = node
                t = str(node.get("type", ""))
                if t and t in op_type:
                    chain = [{**nodes[n], "name": n} for n in [*path, name] if n]
                    return {**node, "name": str(src)}, chain
                above.append((str(src), [*path, name] if name else path))
        level = above
    return None
