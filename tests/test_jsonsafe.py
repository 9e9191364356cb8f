"""Every document's ``to_dict`` writes a figure that could not be computed as null.

The three documents (a bisection, a test's profile, a comparison) once had a helper each,
and the bisection's kept infinities, which ``json.dumps(..., allow_nan=False)`` (how
``bisect.json`` is written) refuses.
"""

from __future__ import annotations

import json
import math

import numpy as np

from perfguard.bisect import BisectResult, Step, TestVerdict
from perfguard.compare.outcomes import Outcome
from perfguard.compare.profile import ProfileOp, TestProfile
from perfguard.jsonsafe import finite


def test_finite_nulls_nan_and_both_infinities_at_any_depth() -> None:
    value = {
        "a": math.inf,
        "b": [1.5, -math.inf, (math.nan, 2)],
        "c": np.float64("nan"),
        "d": {"e": np.float64(3.0), "f": "inf"},
    }
    assert finite(value) == {
        "a": None,
        "b": [1.5, None, [None, 2]],
        "c": None,
        "d": {"e": 3.0, "f": "inf"},
    }


def test_a_bisection_with_an_infinite_change_writes_json() -> None:
    verdict = TestVerdict(
        nodeid="t.py::t",
        outcome=Outcome.REGRESSED,
        decided_by=Outcome.REGRESSED,
        delta_pct=math.inf,
        ci_low_pct=math.nan,
        ci_high_pct=12.0,
    )
    step = Step(commit="abc", subject="s", mark="bad", mode="store", tests=[verdict])
    result = BisectResult(good="g", bad="b", oracle="all", first_bad="abc", steps=[step])
    doc = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    (test,) = doc["steps"][0]["tests"]
    assert test["outcome"] == test["decided_by"] == "regressed"  # the enum, written as its word
    assert (test["delta_pct"], test["ci_low_pct"], test["ci_high_pct"]) == (None, None, 12.0)


def test_a_profile_with_an_infinite_efficiency_writes_json() -> None:
    op = ProfileOp(op_name="aten::mm", time_ns=5.0, flop_efficiency=math.inf)
    profile = TestProfile(basis="cpu", iterations=1, ops=[op], tc_utilization=math.nan)
    doc = json.loads(json.dumps(profile.to_dict(), allow_nan=False))
    assert doc["ops"][0]["flop_efficiency"] is None and doc["ops"][0]["time_ns"] == 5.0
    assert doc["tc_utilization"] is None
