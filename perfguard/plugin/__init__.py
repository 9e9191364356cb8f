"""The pytest plugin (entry point ``pytest11: perfguard``).

``pytest --perfguard`` captures every test marked ``@pytest.mark.gpuprofile``
(or using the ``gpuprofile`` fixture), compares it with the baseline of an
earlier commit and fails the ones that regressed. Without ``--perfguard``
marked tests run as ordinary tests (``gpuprofile.iterations()`` still runs
its steps) and nothing heavy is imported: this module, :mod:`.options`,
:mod:`.marker` and :mod:`.iterate` use the standard library and pytest only.
With ``--perfguard``, :class:`perfguard.plugin.session.PerfguardSession` is
registered and does the work (see its docstring for where each step runs).
In a child pytest started by the nsys backend (``PERFGUARD_CHILD`` set),
:class:`perfguard.plugin.child.ChildPlugin` runs instead.

Plugin state lives in ``config.stash``, never in attributes of ``config``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from perfguard.capture.capturers import CHILD_ENV
from perfguard.plugin import benchmark_fixture
from perfguard.plugin.items import BENCHMARKS_ENV, FIXTURE, profile_key, profiled, spec_key, spec_of
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import MARKER, MARKER_HELP, ProfileSpec
from perfguard.plugin.options import Settings, add_options, check_spaced_values, read_settings
from perfguard.plugin.shards import ShardSelector
from perfguard.plugin.valgrind_child import ForkEachTest, callgrind_child

if TYPE_CHECKING:
    from perfguard.plugin.child import ChildPlugin
    from perfguard.plugin.session import PerfguardSession

__all__ = [
    "FIXTURE",
    "GpuProfile",
    "ProfileSpec",
    "gpuprofile",
    "profile_key",
    "profiled",
    "settings_key",
    "spec_key",
    "spec_of",
]

settings_key: pytest.StashKey[Settings] = pytest.StashKey()
#: the value ``PERFGUARD_BENCHMARKS`` had before this session set it for its children
_benchmarks_env_key: pytest.StashKey[str | None] = pytest.StashKey()
session_key: pytest.StashKey[PerfguardSession] = pytest.StashKey()
child_key: pytest.StashKey[ChildPlugin] = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """A path option written apart that moved pytest's rootdir stops the session here, before
    the project's conftests are imported under the wrong rootdir."""
    check_spaced_values(early_config)


def pytest_configure(config: pytest.Config) -> None:
    check_spaced_values(config)  # loaded by a conftest: the hook above never ran
    config.addinivalue_line("markers", MARKER_HELP)
    settings = read_settings(config)
    config.stash[settings_key] = settings
    if os.environ.get(CHILD_ENV):
        from perfguard.plugin.child import ChildPlugin

        child = ChildPlugin(os.environ[CHILD_ENV])
        config.stash[child_key] = child
        config.pluginmanager.register(child, "perfguard-child")
        benchmark_fixture.register(config, new_profile)
        return
    if callgrind_child():  # the session's Callgrind child only counts: plain loops, one fork each
        config.pluginmanager.register(ForkEachTest(), "perfguard-callgrind")
        benchmark_fixture.register(config, new_profile)
        return
    if settings.enabled:
        from perfguard.plugin.session import PerfguardSession  # the heavy part

        if settings.benchmarks:  # perfguard's child processes select the same tests
            config.stash[_benchmarks_env_key] = os.environ.get(BENCHMARKS_ENV)
            os.environ[BENCHMARKS_ENV] = "1"
        session = PerfguardSession(config, settings)
        config.stash[session_key] = session
        config.pluginmanager.register(session, "perfguard-session")
        benchmark_fixture.register(config, new_profile)
        if settings.shard_part is not None and session.child is None:
            shard = ShardSelector(settings.shard_part, profiled, session.context.stored_durations)
            session.context.shard = shard.plan
            config.pluginmanager.register(shard, "perfguard-shard")
    elif settings.shard_part is not None:  # a plain run, split by count
        config.pluginmanager.register(
            ShardSelector(settings.shard_part, profiled, dict), "perfguard-shard"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    if _benchmarks_env_key in config.stash:
        before = config.stash[_benchmarks_env_key]
        if before is None:
            os.environ.pop(BENCHMARKS_ENV, None)
        else:
            os.environ[BENCHMARKS_ENV] = before
    for name in (benchmark_fixture.PLUGIN_NAME, "perfguard-shard"):
        extra = config.pluginmanager.get_plugin(name)
        if extra is not None:
            config.pluginmanager.unregister(extra)
    keys: tuple[pytest.StashKey[Any], ...] = (session_key, child_key)
    for key in keys:
        plugin: Any = config.stash.get(key, None)
        if plugin is not None:
            del config.stash[key]
            plugin.close()
            config.pluginmanager.unregister(plugin)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A bad ``gpuprofile`` marker is this test's setup error, with the reason only."""
    if not profiled(item):
        return
    try:
        spec_of(item)
    except ValueError as exc:
        message = f"@pytest.mark.{MARKER} on {item.nodeid}: {exc}"
        session: Any = item.config.stash.get(session_key, None)
        if session is not None:  # the test's row says why, not "no test was measured"
            session.marker_error(item, message)
        pytest.fail(message, pytrace=False)


@pytest.fixture
def gpuprofile(request: pytest.FixtureRequest) -> Iterator[GpuProfile]:
    """The benchmark loop: ``for step in gpuprofile.iterations(): train_step()``.

    Runs the marker's ``warmup`` steps unrecorded, then ``iterations``
    recorded steps, each a ``perfguard.iteration`` range timed between
    device synchronisations; under ``--perfguard`` the recorded steps are
    captured and the test is compared with its baseline.
    """
    item = request.node
    profile = new_profile(item, spec_of(item))
    item.stash[profile_key] = profile
    yield profile
    profile.close()


def new_profile(item: pytest.Item, spec: ProfileSpec) -> GpuProfile:
    """The loop of a test: the session's (captured), the nsys child's, or a plain one; the
    ``gpuprofile`` fixture's, and pytest-benchmark's ``benchmark`` where perfguard measures
    it (:mod:`perfguard.plugin.benchmark_fixture`)."""
    config = item.config
    session = config.stash.get(session_key, None)
    child = config.stash.get(child_key, None)
    if session is not None:
        return session.profile_for(item, spec)
    if child is not None:
        return child.profile_for(item, spec)
    return GpuProfile(spec)
