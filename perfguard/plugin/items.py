"""Which pytest items perfguard measures, and with what: the marker's checked arguments and
the loop each item ran, kept in the item's stash.

A module of its own so the hook dispatcher (:mod:`perfguard.plugin`), the session and the
nsys child read them without importing each other. Standard library and pytest only.
"""

from __future__ import annotations

import pytest

from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import MARKER, ProfileSpec, parse_marker

#: the fixture whose use marks a test as measured, as the marker does
FIXTURE = "gpuprofile"

spec_key: pytest.StashKey[ProfileSpec] = pytest.StashKey()
profile_key: pytest.StashKey[GpuProfile] = pytest.StashKey()


def profiled(item: pytest.Item) -> bool:
    """Whether perfguard measures ``item``: it carries the marker or uses the fixture."""
    return item.get_closest_marker(MARKER) is not None or FIXTURE in getattr(
        item, "fixturenames", ()
    )


def spec_of(item: pytest.Item) -> ProfileSpec:
    """The item's checked marker arguments (cached); ValueError for a bad marker."""
    spec = item.stash.get(spec_key, None)
    if spec is None:
        spec = parse_marker(item.get_closest_marker(MARKER))
        item.stash[spec_key] = spec
    return spec
