"""Choosing the framework's capturer for a test, and capturers that cannot start.

Runs without TensorFlow or JAX: a missing framework is simulated the way
Python sees one (``sys.modules[name] = None`` makes its import fail).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy
import pytest

from perfguard.capture.frameworks import (
    DeferredCapturer,
    empty_capture_reason,
    framework_for,
    make_capturer,
    normalise,
)
from perfguard.capture.jax import JaxCapturer
from perfguard.capture.tensorflow import TensorFlowCapturer
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import ProfileSpec


def _module(**names: object) -> types.ModuleType:
    mod = types.ModuleType("test_example")
    vars(mod).update(names)
    return mod


def test_marker_argument_wins_and_aliases() -> None:
    mod = _module(np=numpy)
    assert [framework_for(mod, r) for r in ("tensorflow", "Keras", "TF", "flax", "pytorch")] == [
        "tf",
        "tf",
        "tf",
        "jax",
        "torch",
    ]
    assert framework_for(mod) == "torch"  # imports none: today's behaviour
    with pytest.raises(ValueError, match="unknown framework 'mxnet'"):
        normalise("mxnet")


def test_what_the_module_imported() -> None:
    jnp = types.ModuleType("jax.numpy")
    tf = types.ModuleType("tensorflow")

    def jitted() -> None: ...

    jitted.__module__ = "jax._src.pjit"
    assert framework_for(_module(jnp=jnp, np=numpy)) == "jax"
    assert framework_for(_module(f=jitted)) == "jax"
    assert framework_for(_module(tf=tf)) == "tf"
    with pytest.raises(ValueError, match=r"uses jax and tf: .*framework=\.\.\."):
        framework_for(_module(jnp=jnp, tf=tf))
    assert framework_for(_module(jnp=jnp, tf=tf), "jax") == "jax"


def test_what_the_loop_caller_holds_counts_when_the_module_names_nothing() -> None:
    """``tf = pytest.importorskip("tensorflow")`` inside the test: only its locals say so."""
    tf = types.ModuleType("tensorflow")
    assert framework_for(_module(np=numpy), None, [tf, 3]) == "tf"
    with pytest.raises(ValueError, match="uses jax and tf"):
        framework_for(_module(jnp=types.ModuleType("jax.numpy")), None, [tf])


def test_loaded_frameworks_decide_only_when_one_is_loaded(monkeypatch) -> None:
    for name in ("torch", "tensorflow", "jax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    assert framework_for(_module(), loaded=True) == "jax"
    assert framework_for(_module(), loaded=False) == "torch"
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    assert framework_for(_module(), loaded=True) == "torch"  # ambiguous: the default
    reason = empty_capture_reason("torch")
    assert reason.startswith("captured no ops") and 'framework="tf"' in reason


def test_an_empty_capture_of_pure_python_says_so(monkeypatch) -> None:
    for name in ("tensorflow", "jax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert "pure Python" in empty_capture_reason("torch")
    assert "no NVTX or framework ranges" in empty_capture_reason(None)  # nsys


def test_the_deferred_capturer_decides_when_the_loop_starts(tmp_path: Path) -> None:
    cap = DeferredCapturer(None, _module(np=numpy), tmp_path / "t", "cpu", ".pt.trace.json.gz")
    assert cap.inner is None and cap.error is None
    assert cap.decide([types.ModuleType("jax.numpy")]) == "jax"
    assert isinstance(cap.inner, JaxCapturer) and cap.path == tmp_path / "t.xplane.pb"
    assert cap.decide([types.ModuleType("tensorflow")]) == "jax"  # decided once
    marked = DeferredCapturer("tf", _module(), tmp_path / "u", "cpu", ".pt.trace.json.gz")
    assert marked.decide([types.ModuleType("jax")]) == "tf"


def test_capturers_name_their_file(tmp_path: Path) -> None:
    cap = make_capturer("jax", tmp_path / "t", "cpu")
    assert isinstance(cap, JaxCapturer) and cap.path == tmp_path / "t.xplane.pb"
    cap = make_capturer("tensorflow", tmp_path / "t.xplane.pb", "cuda")
    assert isinstance(cap, TensorFlowCapturer) and cap.path == tmp_path / "t.xplane.pb"


@pytest.mark.parametrize("framework,module", [("jax", "jax"), ("tf", "tensorflow")])
def test_missing_framework_is_an_error_not_a_crash(
    framework: str, module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    cap = make_capturer(framework, tmp_path / "t", "cpu")
    gp = GpuProfile(ProfileSpec(iterations=2, warmup=0, rounds=1), cap)
    ran = [step for step in gp.iterations()]
    # one timing round (profiler off on the CPU), then the profiled round: the test ran,
    # uncaptured (a timing round the machine slowed down is run again: its steps repeat)
    assert ran == [0, 1] * (1 + gp.slow_rounds) + [2, 3]
    assert gp.completed and gp.profiled == [False] * 2 + [True] * 2
    assert cap.error is not None and "profiler did not start" in cap.error
    assert "\n" not in cap.error and not cap.path.exists()


def test_unwritable_output_is_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cap = make_capturer("jax", blocker / "sub" / "t", "cpu")
    cap.start()
    cap.stop()
    assert cap.error is not None and "did not start" in cap.error


def test_runner_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from perfguard.capture import xspace_runner

    assert xspace_runner.main(["--framework", "jax", "--output", "x.xplane.pb"]) == 2
    assert "put `--` before the program" in capsys.readouterr().err
    assert xspace_runner.main(["--framework", "jax", "--output", "x.xplane.pb", "--"]) == 2
    assert "nothing to run" in capsys.readouterr().err


def test_profile_backends_are_selectable() -> None:
    from perfguard.capture.select import BACKENDS
    from perfguard.capture.xspace_runner import XSpaceBackend

    assert {"tf", "jax"} <= set(BACKENDS)
    with pytest.raises(Exception, match="framework must be one of"):
        XSpaceBackend("mxnet")
    assert XSpaceBackend("jax").name == "jax"
