"""The call-site pass: one step under a torch function mode that names each call's statement.

Why a pass of its own (the file format and how readers use it:
:mod:`perfguard.trace.site_pass`): torch's Python tracer, the profiler's only source
of stacks, records every Python call of every profiled iteration and gives the line a
function *starts* on. A ``TorchFunctionMode`` sees every torch call the Python code
makes (``F.linear``, ``x.softmax``, ``opt.step``'s ``torch._foreach_*``), before
dispatch, on the thread that made it, so the frame that made it is right there:
:class:`SiteMode` walks from it to the innermost frame of the user's code
(:func:`perfguard.trace.call_sites.is_library_file`: not torch, not an installed
package, not the standard library), reads that frame's *current* line, function and
source text and the user's frames above it, and opens a ``perfguard.site#N``
``record_function`` around the call, so every op the call runs nests in it on the
profiler's timeline. The profiler runs for that one step with no shapes and no
stacks; its in-memory results (never written as a trace) are tied to the markers by
nesting, and backward nodes to their forward op by the sequence number
(:func:`perfguard.trace.site_pass.event_sites`).

Measured (benchmarks/site_pass.py): the pass costs a few steps' time once per test,
where the Python tracer stretched every profiled step.

Calls the mode sees while it handles one are not seen again (the mode is off inside
its own handler), so a site is the user's outermost torch call, not the library's
calls inside it. Code compiled by ``torch.compile`` is not traced under the mode (its
frames run compiled; the pass is skipped once Dynamo has compiled anything, so the
mode never causes a recompile) and keeps the sites Inductor's provenance gives.
"""

from __future__ import annotations

import linecache
import sys
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import Any

import numpy as np
import pandas as pd

from perfguard.capture.torch_profiler import start_profiler
from perfguard.trace.call_sites import is_library_file, site_text
from perfguard.trace.site_pass import ITERATION, MARKER, Site, SitePass, event_sites, write_sites

#: user frames kept above a site (the site's own frame first), up to the test
STACK_DEPTH = 8


def compiled_anything() -> bool:
    """Whether Dynamo has compiled a frame in this process (never imports it)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.counters["stats"]["unique_graphs"])
    except Exception:  # an internal table that moved: assume compiled, skip the pass
        return True


class _Sites:
    """The sites seen so far: one index per distinct (frames, lines) stack."""

    def __init__(self) -> None:
        self.index: dict[tuple[Any, ...], int] = {}
        self.sites: list[Site] = []
        self._library: dict[CodeType, bool] = {}

    def _is_library(self, code: CodeType) -> bool:
        lib = self._library.get(code)
        if lib is None:
            lib = self._library[code] = is_library_file(code.co_filename)
        return lib

    def of(self, frame: FrameType | None) -> int:
        """The site index of the innermost user frame at or above ``frame`` (-1: none)."""
        key: list[Any] = []
        frames: list[FrameType] = []
        while frame is not None and len(frames) < STACK_DEPTH:
            code = frame.f_code
            if not self._is_library(code):
                key += (code, frame.f_lineno)
                frames.append(frame)
            frame = frame.f_back
        if not frames:
            return -1
        k = tuple(key)
        found = self.index.get(k)
        if found is None:
            found = self.index[k] = len(self.sites)
            self.sites.append(_site(frames))
        return found


def _where(frame: FrameType) -> str:
    return f"{site_text(frame.f_code.co_filename, frame.f_lineno)} in {_function(frame)}"


def _function(frame: FrameType) -> str:
    code = frame.f_code
    return str(getattr(code, "co_qualname", code.co_name))


def _site(frames: list[FrameType]) -> Site:
    top = frames[0]
    file, line = top.f_code.co_filename, top.f_lineno
    return Site(
        where=site_text(file, line),
        function=_function(top),
        code=linecache.getline(file, line).strip(),
        stack=tuple(_where(f) for f in frames[1:]),
    )


class LineCounter:
    """How many times each line of the user's code ran in the pass's step (``sys.settrace``
    line events, traced only in the user's frames: a library frame returns no local
    tracer). Deterministic where the step is: the count a pure-Python change moves (a
    loop over more items, a helper called more often), which no op counter sees and an
    instruction count sees only as the interpreter's work (:mod:`perfguard.compare.sites`
    names the line whose count grew)."""

    def __init__(self, sites: _Sites) -> None:
        self.sites = sites
        self.hits: dict[tuple[CodeType, int], int] = {}
        self._previous: Any = None
        self._on = False
        self._running: list[FrameType] = []

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            key = (frame.f_code, frame.f_lineno)
            self.hits[key] = self.hits.get(key, 0) + 1
        return self._line

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call" or self.sites._is_library(frame.f_code):
            return None
        return self._line

    def start(self) -> None:
        self._previous = sys.gettrace()
        sys.settrace(self._call)
        self._on = True
        # frames already running (the test's own, whose loop body is the step) get no
        # call event: their lines are traced from here by a local tracer of their own
        self._running = []
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if not self.sites._is_library(frame.f_code):
                frame.f_trace = self._line
                self._running.append(frame)
            frame = frame.f_back

    def stop(self) -> None:
        if self._on:
            sys.settrace(self._previous)
            self._on = False
            for frame in self._running:
                frame.f_trace = None
            self._running = []

    def counts(self, top: int = 500) -> list[list[Any]]:
        """``[site, function, source text, runs]`` of the :data:`top` lines that ran most."""
        rows = sorted(self.hits.items(), key=lambda kv: -kv[1])[:top]
        return [
            [
                site_text(code.co_filename, line),
                str(getattr(code, "co_qualname", code.co_name)),
                linecache.getline(code.co_filename, line).strip(),
                n,
            ]
            for (code, line), n in rows
        ]


def _mode_class() -> type:
    """:class:`SiteMode`'s class, made on first use (torch is imported only then)."""
    import torch
    from torch.overrides import TorchFunctionMode

    record = torch.profiler.record_function

    class SiteMode(TorchFunctionMode):
        """Opens a ``perfguard.site#N`` range around every torch call the code makes."""

        def __init__(self, sites: _Sites) -> None:
            super().__init__()
            self.sites = sites

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            site = self.sites.of(sys._getframe(1))
            if site < 0:
                return func(*args, **(kwargs or {}))
            with record(f"{MARKER}{site}"):
                return func(*args, **(kwargs or {}))

    return SiteMode


class SitePassRun(AbstractContextManager["SitePassRun"]):
    """``with SitePassRun(capture): step()``: the pass over the body, its file written
    beside ``capture`` on exit. Never raises for its own sake: a failure is kept in
    ``error`` and the test goes on (its capture then has the sites it has without)."""

    def __init__(self, capture: Path) -> None:
        self.capture = capture
        self.error: str | None = None
        self.found: SitePass | None = None
        self._sites = _Sites()
        self._prof: Any = None
        #: the pass's profiler once stopped (its results are read on exit)
        self._prof_done: Any = None
        self._mode: Any = None
        self._lines = LineCounter(self._sites)

    def __enter__(self) -> SitePassRun:
        # the statements' text is read through linecache: a file edited since this process
        # last read it (a long-lived process, pytester in-process) must not lend the old
        # text to the new line numbers, which would match sites across commits wrongly
        linecache.checkcache()
        try:
            import torch  # optional and heavy: only when the pass runs

            self._prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                record_shapes=False,
                with_stack=False,
                with_flops=False,
            )
            start_profiler(torch, self._prof)  # without importing Inductor (1.4 s of CPU)
            self._mode = _mode_class()(self._sites)
            self._mode.__enter__()
            self._lines.start()
        except Exception as exc:  # noqa: BLE001 - the test runs on without the pass
            self.error = f"the call-site pass did not start: {type(exc).__name__}: {exc}"
            self._close()
        return self

    def _close(self) -> None:
        self._lines.stop()
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()
            self._prof_done = prof

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._mode is None:
            return
        try:
            self._close()
            if exc_type is None:
                found = from_profiler(self._prof_done, self._sites.sites)
                self.found = replace(found, lines=self._lines.counts())
                write_sites(self.capture, self.found)
        except Exception as err:  # noqa: BLE001 - a note, never the test's failure
            self.error = f"the call-site pass failed: {type(err).__name__}: {err}"


def from_profiler(prof: Any, sites: list[Site]) -> SitePass:
    """Each op name's calls in the step, in order, with their site index
    (:func:`perfguard.trace.site_pass.event_sites`). torch's results are one Python
    object per event (its API); a step's few thousand are read once into arrays."""
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if str(e.device_type()).endswith("CPU") and not e.is_python_function()
    ]
    n = len(events)
    names = np.array([str(e.name()) for e in events], dtype=object)
    start = np.fromiter((e.start_ns() for e in events), np.int64, n)
    end = start + np.fromiter((e.duration_ns() for e in events), np.int64, n)
    tid = pd.factorize(pd.Series([e.start_thread_id() for e in events], dtype=object))[0]
    seq = np.fromiter((e.sequence_nr() for e in events), np.int64, n)
    marker = pd.Series(names, dtype=object).str.startswith(MARKER).to_numpy(bool)
    own = np.full(n, -1, dtype=np.int64)
    own[marker] = [int(x[len(MARKER) :]) for x in names[marker]]
    codes = event_sites(names, start, end, tid, seq, own)
    ops = ~marker & (names != ITERATION)
    order = np.flatnonzero(ops)[np.lexsort((end[ops], start[ops]))]
    calls: dict[str, list[int]] = {}
    for name, code in zip(names[order], codes[order], strict=True):
        calls.setdefault(str(name), []).append(int(code))
    return SitePass(tuple(sites), calls)


class WindowSites:
    """``perfguard profile``'s call sites: the mode runs over the window's recorded
    iterations, inside the window's own profiler session (a second session cannot run
    beside it), so its markers are in the capture itself and the reader ties each op to
    its innermost one (:func:`perfguard.trace.site_pass.apply_sites`, ``marked``). The
    mode's handler costs a few microseconds a torch call in those iterations: a window's
    figures are for attribution, not for a verdict (the plugin's pass runs apart for that
    reason). A :class:`perfguard.capture.torch_window.WindowObserver`."""

    def __init__(self) -> None:
        self._sites = _Sites()
        self._mode: Any = None

    def window_opened(self) -> None:
        try:
            self._mode = _mode_class()(self._sites)
            self._mode.__enter__()
        except Exception as exc:  # noqa: BLE001 - the capture goes on without sites
            self._mode = None
            print(f"perfguard: note: no call sites: {type(exc).__name__}: {exc}", file=sys.stderr)

    def window_closed(self, trace: Path) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        mode.__exit__(None, None, None)
        found = SitePass(
            tuple(self._sites.sites),
            {},
            marked=True,
            source="perfguard call-site markers in the capture (perfguard profile)",
        )
        write_sites(trace, found)
