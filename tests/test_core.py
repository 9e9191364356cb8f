"""The core without a pytest session: :func:`perfguard.core.measure.measure` runs a real
torch CPU step under a real profiler to a real record, and
:func:`perfguard.core.verdict.verdict` judges it against another such record, as the
plugin does for a ``gpuprofile`` test (nothing here touches a pytest item or config).

The effects are large enough never to flake: the slow step runs its matmul three times,
so its op calls triple (the ``calls`` gate's budget is 0), and the tolerance is wide
(300 %), so an identical step's timing cannot read as a regression on a busy machine.
No timing is asserted as a number.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from perfguard.baseline import Fingerprint, RunInfo  # noqa: E402
from perfguard.baseline.store import Store  # noqa: E402
from perfguard.capture.capturers import TorchCapturer  # noqa: E402
from perfguard.capture.torch_profiler import TRACE_SUFFIX  # noqa: E402
from perfguard.compare.against import settings_for  # noqa: E402
from perfguard.compare.judge import Against  # noqa: E402
from perfguard.compare.outcomes import Outcome  # noqa: E402
from perfguard.core.measure import measure  # noqa: E402
from perfguard.core.record import Measured  # noqa: E402
from perfguard.core.spec import ProfileSpec  # noqa: E402
from perfguard.core.verdict import verdict  # noqa: E402

NODEID = "model.py::step"
SPEC = ProfileSpec(iterations=3, warmup=1, rounds=3, metrics=("wall_time",), tolerance=3.0)


def _measured(folder: Path, name: str, matmuls: int):
    x = torch.randn(32, 32)

    def step() -> None:
        for _ in range(matmuls):
            torch.mm(x, x)

    capturer = TorchCapturer(folder / f"{name}{TRACE_SUFFIX}", "cpu")
    return measure(SPEC, capturer, step, nodeid=NODEID, scope=[x])


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("core")
    return {
        "baseline": _measured(folder, "baseline", 1),
        "same": _measured(folder, "same", 1),
        "slow": _measured(folder, "slow", 3),
    }


def test_measure_makes_the_record_the_plugin_makes(records) -> None:
    base = records["baseline"]
    assert base.nodeid == NODEID and base.metric == "wall_time"
    # the timed rounds ran apart from the profiler (CPU), the profiled round after them
    assert base.timed_apart
    assert len(set(base.rounds().tolist())) == SPEC.rounds
    assert base.meta["tolerance"] == 3.0  # resolved once, carried by the record
    assert base.meta["marker"]["iterations"] == 3


def test_a_slower_step_regresses_against_an_unchanged_baseline(records) -> None:
    base, slow = records["baseline"], records["slow"]
    against = Against(records=[base], commit="a" * 40, run_found=True)
    entry = verdict(slow, against, settings_for(slow), Measured(slow, backend="cpu"))
    assert entry.outcome is Outcome.REGRESSED, entry.message
    assert entry.gates is not None and entry.gates.outcome is Outcome.REGRESSED
    assert entry.nodeid == NODEID and entry.baseline_commit == "a" * 40
    assert entry.explained.text()  # the words a failed test shows


def test_an_identical_step_does_not_regress(records) -> None:
    base, same = records["baseline"], records["same"]
    against = Against(records=[base], commit="a" * 40, run_found=True)
    entry = verdict(same, against, settings_for(same))
    assert entry.outcome is not Outcome.REGRESSED, entry.message
    assert entry.gates is not None and entry.gates.outcome is Outcome.UNCHANGED
    # the timing was judged (three rounds each side), and it too held
    assert entry.timing is not None and entry.timing.outcome is not Outcome.NOT_JUDGED
    assert entry.timing.outcome is not Outcome.REGRESSED
    assert entry.tolerance_pct == pytest.approx(300.0)


def test_without_a_baseline_the_verdict_says_so(records) -> None:
    entry = verdict(records["same"], Against(), settings_for(records["same"]))
    assert entry.outcome is Outcome.NO_BASELINE


def test_a_capture_with_no_op_is_not_judged_live_or_stored(tmp_path: Path) -> None:
    """A pure-Python step leaves the profiler nothing to attribute: the record says why
    when it is made, and the judge says it for that record whether it is judged live or
    read back from a store later (a stored comparison read ``unchanged`` where the live
    session read ``not-judged``)."""

    def python_step() -> None:
        sum(i * i for i in range(20_000))

    def made(name: str):
        capturer = TorchCapturer(tmp_path / f"{name}{TRACE_SUFFIX}", "cpu")
        return measure(SPEC, capturer, python_step, nodeid=NODEID)

    base, head = made("base"), made("head")
    assert "captured no ops" in head.meta["empty_capture"]
    store_path = tmp_path / "store.db"
    with Store(store_path) as store:
        for i, rec in enumerate((base, head)):
            info = RunInfo(f"{i}" * 40, "main", False, f"2026-01-0{i + 1}T00:00:00Z", Fingerprint())
            store.save_run(info, [rec])
    with Store(store_path, create=False) as store:
        stored = [store.load_test(run_id, NODEID) for run_id in (1, 2)]
    for old, new in ((base, head), stored):
        assert old is not None and new is not None
        against = Against(records=[old], commit="0" * 40, run_found=True)
        entry = verdict(new, against, settings_for(new))
        assert entry.outcome is not Outcome.UNCHANGED  # never silently
        assert entry.message.startswith("captured no ops"), entry.message
