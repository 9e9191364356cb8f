"""Which pytest items perfguard measures, and with what: the marker's checked arguments and
the loop each item ran, kept in the item's stash.

A module of its own so the hook dispatcher (:mod:`perfguard.plugin`), the session and the
nsys child read them without importing each other. Standard library and pytest only.
"""

from __future__ import annotations

import os

import pytest

from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import MARKER, ProfileSpec, parse_marker

#: the fixture whose use marks a test as measured, as the marker does
FIXTURE = "gpuprofile"
#: pytest-benchmark's fixture: a measured test that uses it runs perfguard's loop through it
#: (:mod:`perfguard.plugin.benchmark_fixture`)
BENCHMARK_FIXTURE = "benchmark"
#: ``--perfguard-benchmarks`` as perfguard's child processes (nsys, Callgrind, A/B rounds,
#: isolation) see it: they get the parent's environment, not its command line
BENCHMARKS_ENV = "PERFGUARD_BENCHMARKS"

spec_key: pytest.StashKey[ProfileSpec] = pytest.StashKey()
profile_key: pytest.StashKey[GpuProfile] = pytest.StashKey()


def selects_benchmarks(config: pytest.Config) -> bool:
    """Whether every test using ``benchmark`` is measured (``--perfguard-benchmarks``, its
    ini key, or the parent session's word in a child process)."""
    if config.getoption("perfguard_benchmarks", None) or os.environ.get(BENCHMARKS_ENV) == "1":
        return True
    try:
        return bool(config.getini("perfguard_benchmarks"))
    except ValueError:  # the plugin's options are not registered (a foreign config)
        return False


def profiled(item: pytest.Item) -> bool:
    """Whether perfguard measures ``item``: it carries the marker or uses the fixture, or it
    uses pytest-benchmark's fixture and the session selects those tests."""
    names = getattr(item, "fixturenames", ())
    if item.get_closest_marker(MARKER) is not None or FIXTURE in names:
        return True
    return BENCHMARK_FIXTURE in names and selects_benchmarks(item.config)


def uses_loop(item: pytest.Item) -> bool:
    """Whether a measured ``item`` runs a loop of recorded steps (the ``gpuprofile`` fixture,
    or ``benchmark(...)``), rather than being captured whole as one iteration."""
    names = getattr(item, "fixturenames", ())
    return FIXTURE in names or BENCHMARK_FIXTURE in names


def spec_of(item: pytest.Item) -> ProfileSpec:
    """The item's checked marker arguments (cached); ValueError for a bad marker."""
    spec = item.stash.get(spec_key, None)
    if spec is None:
        spec = parse_marker(item.get_closest_marker(MARKER))
        item.stash[spec_key] = spec
    return spec
