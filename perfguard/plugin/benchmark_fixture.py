"""pytest-benchmark's ``benchmark`` fixture, measured by perfguard's loop.

A test written for pytest-benchmark (``benchmark(fn, *args, **kwargs)``,
``benchmark.pedantic(fn, args=..., setup=...)``) that perfguard measures (marked
``gpuprofile``, or every such test with ``--perfguard-benchmarks``) runs unchanged:
the benchmarked call is the step of the same :class:`~perfguard.plugin.iterate.GpuProfile`
loop the ``gpuprofile`` fixture gives, so warm-up, rounds, the timing between device
synchronisations, the profiled round, the gates, instruction counts and the verdict are
the ones every perfguard test gets. The marker's (or the session's) ``warmup``,
``iterations`` and ``rounds`` decide how often it runs; ``pedantic``'s ``rounds``,
``iterations`` and ``warmup_rounds`` are read only for a note. Its ``setup`` and
``teardown`` run around every call, outside the timing, the iteration range and the
instruction count. The fixture returns what the function returned, as pytest-benchmark's does.

Why an override and not a wrapper of pytest-benchmark's object: its timer calibrates a
number of loops per round and times them together with no device synchronisation, so a
GPU step's time would be its launch cost. The override is registered as a plugin only
where perfguard measures (a ``--perfguard`` session and perfguard's child processes), after
every installed plugin, so it is the ``benchmark`` fixture pytest picks; for a test perfguard
does not measure it hands over to the fixture it overrides (pytest-benchmark's own, with
``--benchmark-disable``, its table and its saves as before). Where pytest-benchmark is
installed the value is a subclass of its ``BenchmarkFixture``: its report hook raises
TypeError for any other value of ``benchmark``.

Standard library and pytest only at import (pytest-benchmark is imported when a measured
test asks for the fixture; perfguard works without it installed).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import pytest

from perfguard.plugin.items import BENCHMARK_FIXTURE, FIXTURE, profile_key, profiled, spec_of
from perfguard.plugin.iterate import GpuProfile
from perfguard.plugin.marker import ProfileSpec

#: makes the ``gpuprofile`` loop of a measured item (the session's, the nsys child's, or a
#: plain one): the function behind the ``gpuprofile`` fixture, shared so both fixtures
#: give the same loop
ProfileFactory = Callable[[pytest.Item, ProfileSpec], GpuProfile]


class PerfguardBenchmark:
    """What a measured test's ``benchmark`` is: pytest-benchmark's calling conventions
    over perfguard's loop (module docstring). One use per test, as pytest-benchmark's."""

    def __init__(self, item: pytest.Item, profile: GpuProfile) -> None:
        self.profile = profile
        # the attributes tests and pytest-benchmark's hooks read of its fixture
        self.name = item.name
        self.fullname = item.nodeid
        callspec = getattr(item, "callspec", None)
        self.param = callspec.id if callspec is not None else None
        self.params = callspec.params if callspec is not None else None
        self.group: str | None = None
        self.extra_info: dict[str, Any] = {}
        self.disabled = False
        self.has_error = False
        self.skipped = False
        self.stats = None
        self.cprofile = False
        self._mode: str | None = None

    @property
    def enabled(self) -> bool:
        return True

    def __call__(self, function_to_benchmark: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function_to_benchmark(*args, **kwargs)`` as each step of the loop; its result."""
        scope = [
            *sys._getframe(1).f_locals.values(),
            function_to_benchmark,
            *args,
            *kwargs.values(),
        ]
        return self._measure(
            "benchmark(...)", function_to_benchmark, _Call(None, args, kwargs), scope
        )

    def pedantic(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        setup: Callable[[], Any] | None = None,
        teardown: Callable[..., Any] | None = None,
        rounds: int = 1,
        warmup_rounds: int = 0,
        iterations: int = 1,
    ) -> Any:
        """pytest-benchmark's checks of the arguments, then :meth:`__call__`'s loop with
        ``setup`` (its ``(args, kwargs)`` used when it returns them) and ``teardown``
        around each step, untimed. Its ``rounds``, ``warmup_rounds`` and ``iterations``
        are perfguard's loop's instead (a note says so)."""
        kwargs = dict(kwargs or {})
        for name, value, least in (
            ("rounds", rounds, 1),
            ("iterations", iterations, 1),
            ("warmup_rounds", warmup_rounds, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"benchmark.pedantic: {name} must be an integer >= {least}")
        if setup is not None and iterations > 1:
            raise ValueError("benchmark.pedantic: can't use more than 1 `iterations` with `setup`")
        spec = self.profile.spec
        asked = (rounds, warmup_rounds, iterations)
        if asked != (1, 0, 1):
            self.profile.notes.append(
                f"benchmark.pedantic(rounds={rounds}, warmup_rounds={warmup_rounds}, "
                f"iterations={iterations}) ran as perfguard's loop: {spec.warmup} warm-up "
                f"call(s), {spec.rounds} round(s) of {spec.iterations} timed call(s)"
            )
        scope = [*sys._getframe(1).f_locals.values(), target, *args, *kwargs.values()]
        call = _Call(setup, args, kwargs)
        return self._measure("benchmark.pedantic(...)", target, call, scope, teardown=teardown)

    def weave(self, target: Any, **kwargs: Any) -> Any:
        """Not measured by perfguard: it patches ``target`` for the whole test."""
        raise NotImplementedError(
            "benchmark.weave is not measured by perfguard: call the function through "
            "benchmark(...) or benchmark.pedantic(...)"
        )

    def _measure(
        self,
        mode: str,
        target: Callable[..., Any],
        call: _Call,
        scope: Iterable[object],
        *,
        teardown: Callable[..., Any] | None = None,
    ) -> Any:
        if self._mode:
            self.has_error = True
            raise RuntimeError(
                f"the benchmark fixture can only be used once; it was used as {self._mode}"
            )
        self._mode = mode
        self.profile.loop_call = mode
        after = None
        if teardown is not None:
            after = functools.partial(call.finish, teardown)
        before = call.prepare if call.setup is not None else None
        result = None
        try:
            for _ in self.profile.iterations(setup=before, teardown=after, scope=scope):
                result = target(*call.args, **call.kwargs)
        except Exception:
            self.has_error = True
            raise
        return result


class _Call:
    """The arguments of each call, as pytest-benchmark makes them: ``setup`` runs before
    each call and, when it returns ``(args, kwargs)``, those are the call's (giving
    ``args``/``kwargs`` too is an error); ``teardown`` gets the call's arguments."""

    def __init__(
        self, setup: Callable[[], Any] | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.setup = setup
        self.given = bool(args or kwargs)
        self.args, self.kwargs = tuple(args), dict(kwargs)

    def prepare(self) -> None:
        made = self.setup() if self.setup is not None else None
        if not made:
            return
        if self.given:
            raise TypeError("Can't use `args` or `kwargs` if `setup` returns the arguments.")
        args, kwargs = made
        self.args, self.kwargs = tuple(args), dict(kwargs)

    def finish(self, teardown: Callable[..., Any]) -> None:
        teardown(*self.args, **self.kwargs)


@functools.cache
def fixture_type() -> type[PerfguardBenchmark]:
    """:class:`PerfguardBenchmark`, a subclass of pytest-benchmark's ``BenchmarkFixture``
    where that is installed (its ``pytest_runtest_makereport`` raises TypeError for any
    other value of ``benchmark``); its own ``__init__`` is never called."""
    try:
        from pytest_benchmark.fixture import BenchmarkFixture
    except ImportError:
        return PerfguardBenchmark
    made = type("PerfguardBenchmarkFixture", (PerfguardBenchmark, BenchmarkFixture), {})
    return cast(type[PerfguardBenchmark], made)


class BenchmarkOverride:
    """The plugin holding the overriding ``benchmark`` fixture (registered by
    :func:`register`, after every installed plugin, so pytest picks it)."""

    def __init__(self, new_profile: ProfileFactory) -> None:
        self.new_profile = new_profile

    @pytest.fixture
    def benchmark(self, request: pytest.FixtureRequest) -> Iterator[Any]:
        """pytest-benchmark's ``benchmark``, measured by perfguard when it measures the test."""
        item = request.node
        if not profiled(item) or FIXTURE in item.fixturenames:
            # not perfguard's (or its gpuprofile loop is): the fixture this one overrides
            yield _overridden(request)
            return
        spec = spec_of(item)
        profile = self.new_profile(item, spec)
        item.stash[profile_key] = profile
        yield fixture_type()(item, profile)
        profile.close()


def _overridden(request: pytest.FixtureRequest) -> Any:
    """The ``benchmark`` fixture below perfguard's (pytest-benchmark's), or a clear failure."""
    try:
        return request.getfixturevalue(BENCHMARK_FIXTURE)
    except pytest.FixtureLookupError:
        pytest.fail(
            f"{request.node.nodeid} uses the benchmark fixture, which is pytest-benchmark's "
            "(not installed here), and perfguard does not measure this test: install "
            "pytest-benchmark, mark the test @pytest.mark.gpuprofile, or pass "
            "--perfguard-benchmarks",
            pytrace=False,
        )


#: the name the override is registered under (unregistered at unconfigure)
PLUGIN_NAME = "perfguard-benchmark"


def register(config: pytest.Config, new_profile: ProfileFactory) -> None:
    """Make perfguard's ``benchmark`` the one pytest picks in this process (called from
    ``pytest_configure``, after the installed plugins registered theirs)."""
    if config.pluginmanager.get_plugin(PLUGIN_NAME) is None:
        config.pluginmanager.register(BenchmarkOverride(new_profile), PLUGIN_NAME)
