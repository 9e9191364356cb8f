"""``--perfguard-shard K/N``: this job runs the K-th of N parts of the measured tests.

A CI matrix of N jobs each runs ``pytest --perfguard --perfguard-shard K/N``; every
measured test (marked ``gpuprofile``, or a ``benchmark`` user under
``--perfguard-benchmarks``) runs in exactly one job, and the tests perfguard does not
measure run in shard 1 only, so the N jobs together run every test exactly once, as
pytest-split's users expect. The rest are deselected through ``pytest_deselected``
(pytest's summary counts them).

The parts are balanced by the seconds each test's timed steps took in the stored run
of the baseline commit (:meth:`~perfguard.baseline.reader.Reader.durations`): greedy,
longest first, each into the lightest part; a test the store does not know weighs the
median of those it knows, and with none known every test weighs 1 (balanced by count).
Ties go by node id, so the same tests and weights give the same parts in every job. The
baseline commit's run is what every job of one CI run reads alike, even while the
other jobs save theirs (a save of HEAD never moves the split). :func:`plan_digest`
names the split; the merge of the jobs' results refuses jobs that split differently.

This module is imported whenever the plugin loads: standard library and pytest only.
"""

from __future__ import annotations

import hashlib
import heapq
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

#: the CI variables naming the run a job belongs to, first found wins: the default
#: ``--perfguard-run-group`` (a CI name prefixed, so two CIs never share a group). The
#: attempt is left out on purpose: a failed shard re-run alone joins its CI run's run
CI_RUN_VARIABLES = (
    ("GITHUB_RUN_ID", "github"),
    ("CI_PIPELINE_ID", "gitlab"),
    ("BUILDKITE_BUILD_ID", "buildkite"),
    ("CIRCLE_WORKFLOW_ID", "circleci"),
    ("BUILD_BUILDID", "azure"),
    ("BUILD_TAG", "jenkins"),
)


#: the key of a pytest-xdist worker's output that carries its split to the controller
WORKER_KEY = "perfguard_shard"


def ci_run_group(environ: Mapping[str, str]) -> str | None:
    """The run group the CI's environment names (``github:123``), or None outside CI."""
    for name, ci in CI_RUN_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return f"{ci}:{value}"
    return None


def parse_shard(value: object) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), 1 <= K <= N; ValueError saying what is wrong."""
    text = str(value).strip()
    k, sep, n = text.partition("/")
    try:
        if not sep:
            raise ValueError
        index, count = int(k), int(n)
    except ValueError:
        raise ValueError(f"{text!r} is not K/N (this job's part K of N, e.g. 2/4)") from None
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"{text!r}: K must be between 1 and N (1-based), N at least 1")
    return index, count


def split(weights: Mapping[str, float], parts: int) -> list[list[str]]:
    """``weights`` (node id -> seconds) cut into ``parts`` lists: greedy, heaviest first
    into the lightest part (the lowest-numbered among equals); ties by node id. Each
    list is sorted by node id."""
    bins: list[list[str]] = [[] for _ in range(parts)]
    heap = [(0.0, i) for i in range(parts)]
    for nodeid in sorted(weights, key=lambda n: (-weights[n], n)):
        load, i = heapq.heappop(heap)
        bins[i].append(nodeid)
        heapq.heappush(heap, (load + weights[nodeid], i))
    return [sorted(b) for b in bins]


def weights_of(nodeids: Sequence[str], stored: Mapping[str, float]) -> dict[str, float]:
    """Each test's weight: its stored seconds, else the median of the known ones; 1 each
    when none is known (count)."""
    known = [stored[n] for n in nodeids if n in stored]
    fill = statistics.median(known) if known else 1.0
    return {n: stored.get(n, fill) if known else 1.0 for n in nodeids}


def plan_digest(parts: Sequence[Sequence[str]]) -> str:
    """A short name of a split: equal in every job that split the same tests the same way."""
    text = "\n".join("\t".join(p) for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ShardSelector:
    """The plugin object of ``--perfguard-shard``: deselects the other parts' tests.

    ``measured(item)`` says whether perfguard measures a test; ``durations()`` gives the
    stored seconds per node id (empty when there is no store or baseline)."""

    def __init__(
        self,
        shard: tuple[int, int],
        measured: Callable[[pytest.Item], bool],
        durations: Callable[[], Mapping[str, float]],
    ) -> None:
        self.index, self.count = shard
        self.measured = measured
        self.durations = durations
        #: after collection: the split's digest, how it was balanced, tests kept
        self.plan: dict[str, object] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        marked = [i.nodeid for i in items if self.measured(i)]
        stored = self.durations() if marked else {}
        weights = weights_of(marked, stored)
        parts = split(weights, self.count)
        mine = set(parts[self.index - 1])
        known = sum(n in stored for n in marked)
        keep: list[pytest.Item] = []
        drop: list[pytest.Item] = []
        for item in items:
            if self.measured(item):
                (keep if item.nodeid in mine else drop).append(item)
            else:  # perfguard does not measure it: shard 1 runs it, once
                (keep if self.index == 1 else drop).append(item)
        self.plan.clear()  # the session's context holds this dict: filled in place
        self.plan.update(
            {
                "shard": f"{self.index}/{self.count}",
                "plan": plan_digest(parts),
                "measured": len(mine),
                "of": len(marked),
                "balanced_by": "stored durations" if known else "count",
                "durations_known": known,
            }
        )
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    # pytest-xdist: the workers collect and split; the controller records the split
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None and self.plan:
            workeroutput[WORKER_KEY] = dict(self.plan)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        plan = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if isinstance(plan, dict) and not self.plan:
            self.plan.update(plan)
