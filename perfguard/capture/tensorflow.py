"""Capture with the TensorFlow profiler (``tf.profiler.experimental``) around recorded steps.

For custom training loops and ``model.fit`` alike: the profiler records
TensorFlow ops (eager and inside ``tf.function`` graphs), and on a GPU the
CUPTI kernels with their correlation ids; each recorded iteration is
``tf.profiler.experimental.Trace("perfguard.iteration", step_num=N, _r=1)``,
the annotation TensorFlow's own step tracking uses. ``device`` is only
reported: TensorFlow profiles every device it uses. Imports TensorFlow when
a capture starts.
"""

from __future__ import annotations

import gc
import linecache
import sys
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from perfguard.capture.xspace_capture import ITERATION_RANGE, XSpaceCapturer
from perfguard.trace.call_sites import is_library_file, site_text
from perfguard.trace.site_pass import Site, SitePass, write_sites
from perfguard.trace.tf_graph import write_graph_facts


class TensorFlowCapturer(XSpaceCapturer):
    """``tf.profiler.experimental.start/stop`` around the recorded iterations."""

    framework = "TensorFlow"

    def __init__(self, path: Path, device: str = "cpu") -> None:
        super().__init__(path, device)
        self._gpus: bool | None = None

    def _start(self, logdir: str) -> None:
        import tensorflow as tf  # optional: loaded only when a TF test is captured

        # TensorFlow's defaults: host ops, no Python tracer (far more events than ops, and
        # slower), device tracer on (CUPTI where there is a GPU)
        tf.profiler.experimental.start(logdir)

    def _stop(self) -> None:
        import tensorflow as tf  # optional: loaded only when a TF test is captured

        tf.profiler.experimental.stop()
        try:  # the line that made each graph op: a note's worth, never the test's failure
            found = graph_sites()
            if found.named:
                write_sites(self.path, found)
        except Exception as exc:  # noqa: BLE001 - TensorFlow's internals moved
            print(
                f"perfguard: note: no TensorFlow call sites: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
        try:  # the graph ops' shapes, for their FLOPs and bytes: a note's worth too
            facts = graph_facts()
            if facts:
                write_graph_facts(self.path, facts)
        except Exception as exc:  # noqa: BLE001 - TensorFlow's internals moved
            print(
                f"perfguard: note: no TensorFlow op shapes: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )

    def _step(self, number: int) -> AbstractContextManager[Any]:
        import tensorflow as tf  # optional: loaded only when a TF test is captured

        return tf.profiler.experimental.Trace(ITERATION_RANGE, step_num=number, _r=1)

    def _sync(self) -> None:
        # eager CPU ops finish before they return: only GPUs have queued work to wait for
        # (a sync is also an op, SyncDevice, that would show in every iteration)
        if self._gpus is None:
            tf = sys.modules.get("tensorflow")
            self._gpus = bool(tf is not None and tf.config.list_logical_devices("GPU"))
        if self._gpus:
            sys.modules["tensorflow"].test.experimental.sync_devices()


def graph_sites() -> SitePass:
    """Each op of the ``tf.function`` graphs this process traced, by node name, with the
    innermost frame of the user's code in its creation traceback (TensorFlow keeps one
    per graph op; eager ops have none). The profiler names a graph op's event by its
    node name, so the XSpace reader ties them by name
    (:func:`perfguard.trace.site_pass.apply_sites`). The functions are found among the
    live objects (a Keras model's ``train_function`` too); the traces already made are
    read from their caches, so nothing is traced again."""
    sites: list[Site] = []
    index: dict[tuple[str, int], int] = {}
    named: dict[str, int] = {}
    for _, graph in traced_graphs():
        for op in graph.get_operations():
            frames = [f for f in reversed(op.traceback) if not is_library_file(f.filename)]
            if not frames:
                continue
            key = (frames[0].filename, frames[0].lineno)
            if key not in index:
                index[key] = len(sites)
                sites.append(
                    Site(
                        where=site_text(frames[0].filename, frames[0].lineno),
                        function=frames[0].name,
                        code=linecache.getline(frames[0].filename, frames[0].lineno).strip(),
                        stack=tuple(
                            f"{site_text(f.filename, f.lineno)} in {f.name}" for f in frames[1:8]
                        ),
                    )
                )
            named.setdefault(op.name, index[key])
    return SitePass(tuple(sites), {}, named, "TensorFlow graph ops' creation tracebacks")


def traced_graphs() -> list[tuple[str, Any]]:
    """The graphs of the ``tf.function`` traces this process made, each with the name the
    profiler gives its runs (``__inference_step_970``), found among the live objects (a Keras
    model's ``train_function`` too) and read from their caches, so nothing is traced again."""
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    # the loop froze what the test built (plugin.iterate): frozen objects are listed by no
    # gc call, so they are thawed for the listing and frozen again as they were
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    try:
        # an isinstance test reads some objects' attributes: torch's deprecated module
        # attributes warn then, an error under pytest's filterwarnings=error
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            functions = [o for o in gc.get_objects() if isinstance(o, Function)]
    finally:
        if frozen:
            gc.freeze()
    graphs: list[tuple[str, Any]] = []
    for fn in functions:
        for config in (fn._variable_creation_config, fn._no_variable_creation_config):
            cache = getattr(config, "function_cache", None)
            for c in cache.values() if cache is not None else ():
                name = c.name.decode() if isinstance(c.name, bytes) else str(c.name)
                graphs.append((name, c.graph))
    return graphs


#: the attributes of a graph op that its cost reads (:mod:`perfguard.analysis.flops.tensorflow`)
COST_ATTRS = ("transpose_a", "transpose_b", "adj_x", "adj_y", "data_format")


def graph_facts() -> dict[str, dict[str, dict[str, Any]]]:
    """Per traced function (:func:`traced_graphs`' name) and node name: the node's type, its
    inputs' shapes (``None`` for an unknown rank or dimension), dtypes and producer nodes, its
    outputs' shapes and dtypes, and :data:`COST_ATTRS` (:mod:`perfguard.trace.tf_graph` says
    why and how they are used). Per function, since two functions' graphs number their nodes
    alike (``sequential_1/dense_1/MatMul`` in two models' steps)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for name, graph in traced_graphs():
        facts = found.setdefault(name, {})
        for op in graph.get_operations():
            attrs = {}
            for key in COST_ATTRS:
                try:
                    value = op.get_attr(key)
                except ValueError:
                    continue
                attrs[key] = value.decode() if isinstance(value, bytes) else value
            facts[op.name] = {
                "type": op.type,
                "in": [_shape(t) for t in op.inputs],
                "dt": [t.dtype.name for t in op.inputs],
                "src": [t.op.name for t in op.inputs],
                "out": [_shape(t) for t in op.outputs],
                "odt": [t.dtype.name for t in op.outputs],
                "attr": attrs,
            }
            if op.type.endswith("PartitionedCall"):  # the function it runs (model.fit's step)
                facts[op.name]["fn"] = op.get_attr("f").name
    return found


def _shape(tensor: Any) -> list[int | None] | None:
    dims = tensor.shape.as_list() if tensor.shape.rank is not None else None
    return None if dims is None else [d if d is None else int(d) for d in dims]
