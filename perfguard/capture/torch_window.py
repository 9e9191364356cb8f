"""The torch runner's window: record a few iterations of the program, not the whole run.

Tracing a whole process call by call is what made ``perfguard profile`` slow: a
5-step CNN script took 153 s and wrote 392 MB (1.35 million events, all Python
calls, ``import torch`` included). A PyTorch profiler user records a window
(``torch.profiler.schedule(wait, warmup, active)``) instead; the runner does the
same for a program that never calls ``prof.step()``, finding the iterations
itself by their **key node**, the range that ends each one, as ``perfguard
analyze --key-node`` does:

1. ``--key-node NAME``: each end of a ``record_function`` range called NAME;
2. else the program's own iteration ranges (``perfguard.iteration``,
   ``ProfilerStep#N``): each end of one;
3. else each ``optimizer.step()`` of the first optimizer that steps (torch's
   global post-hook, :func:`torch.optim.optimizer.register_optimizer_step_post_hook`,
   says which optimizer; the iteration ends where its ``Optimizer.step#...``
   range ends).

The first of 2 and 3 to happen decides. The first ``warmup`` iterations run
unrecorded (start-up, autotuning, allocator growth), then ``iterations`` are
recorded and the profiler stops for good: the rest of the program runs at full
speed. Each recorded iteration is a ``ProfilerStep#N`` range (N counted from 0,
as torch numbers them) unless the program's own ranges are the key node (2),
so ``perfguard analyze`` of the capture finds exactly the window's iterations.
No Python tracer (``with_stack``) by default.

Until the window opens a *provisional* session records from the program's
start, for at most ``fallback_s`` seconds (a ``SIGALRM`` timer on the main
thread: Kineto stops only on the thread that started it). It is discarded when
the window opens, and is the capture when the window never does: a program
without a key node (no optimizer, no iteration ranges), or one that ended
during the warm-up. The report then says which: the whole run, or its first
``fallback_s`` seconds.

A program that ends inside the window leaves its last, unfinished step open;
that range is renamed :data:`AFTER_LAST_STEP` in the trace, so it is not
counted as an iteration.

Observers (:class:`WindowObserver`) are told when the window opens and when its
trace is written: the place for a pass that runs only while the window records
(the call-site pass of ``perfguard/capture/sites.py`` plugs in here).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from perfguard.capture.torch_profiler import (
    DEFAULT_FALLBACK_S,
    DEFAULT_ITERATIONS,
    DEFAULT_WARMUP,
    _export,
    _StepAside,
    new_profiler,
    start_profiler,
)
from perfguard.trace.names import ITERATION_NAMES

#: the name the open step of a program that ended inside the window takes
AFTER_LAST_STEP = "perfguard.after_last_step"
STEP_PREFIX = "ProfilerStep#"
OPTIMIZER_PREFIX = "Optimizer.step#"


@dataclass(frozen=True)
class WindowSpec:
    """Which iterations the runner records."""

    warmup: int = DEFAULT_WARMUP
    iterations: int = DEFAULT_ITERATIONS
    key_node: str | None = None
    fallback_s: float = DEFAULT_FALLBACK_S


@dataclass(frozen=True)
class WindowReport:
    """What the capture holds, for the command's ``capture:`` line and notes."""

    #: ``window`` (the iterations asked for), ``short`` (the program ended inside the
    #: window), ``fallback`` (the window never opened), ``aside`` (the program's own
    #: profiler took over)
    kind: str
    iterations: int
    warmup: int
    #: what ended each iteration ("optimizer step SGD", "perfguard.iteration", ...)
    key_node: str
    detail: str
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class WindowObserver(Protocol):
    """Told when the window opens and when its trace is written (the call-site pass)."""

    def window_opened(self) -> None: ...

    def window_closed(self, trace: Path) -> None: ...


class TorchWindow:
    """Drive the profiler through the window while the program runs (see the module doc).

    Use as a context manager around the program; :attr:`report` says what was
    captured once it exits.
    """

    def __init__(
        self,
        torch: Any,
        spec: WindowSpec,
        session: Callable[[bool], Any],
        out: Path,
        *,
        with_stack: bool = False,
        observers: Sequence[WindowObserver] = (),
    ) -> None:
        if spec.warmup < 1 or spec.iterations < 1:
            raise ValueError("a window needs warmup >= 1 and iterations >= 1")
        self.torch = torch
        self.spec = spec
        self.new_session = session
        self.out = out
        self.with_stack = with_stack
        self.observers = list(observers)
        self.report: WindowReport | None = None
        self.n = 0  # key nodes seen: iterations ended
        #: "node" (--key-node), "ranges" (the program's), "optimizer", or None yet
        self.source: str | None = "node" if spec.key_node else None
        self.key_name = spec.key_node or ""
        self.phase = "before"  # before | window | done | aside
        self.prof: Any = None  # the session recording now, if any
        #: the provisional session (recording, or stopped), until the window holds an
        #: iteration: the capture if it never does
        self.provisional: Any = None
        self.cut_at: float | None = None  # seconds after the start the provisional stopped
        self.t0 = time.monotonic()
        self.step: Any = None  # our open ProfilerStep range
        self.stepped: Any = None  # the optimizer the window follows
        self.step_pending = False  # it just stepped: its range's end is the key node
        self.depth = 0  # nesting of the key node's range
        self.open = 0  # the program's record_function ranges open now (on its thread)
        self.low = 0  # the fewest open since the last key node
        self.due = False  # an iteration ended: the window's work for it is waiting
        self.level = 0  # ... for this few ranges open
        self.step_level = 0  # ranges open when our step opened
        self.partial: list[str] = []  # our steps that are no whole iteration
        self.opened_at = 0  # iterations ended when the window opened (the warm-up run)
        self.busy = False  # inside our own work: the timer waits
        self.thread = threading.get_ident()
        self.guard = _StepAside(torch, self._ours, self._step_aside, out)
        self._undo: list[Callable[[], None]] = []
        #: the program's ``record_function`` ranges open now, outermost first (see
        #: :meth:`_split_open_ranges`)
        self.ranges: list[Any] = []

    # --- the program's side: hooks -------------------------------------------------

    def __enter__(self) -> TorchWindow:
        self.guard.__enter__()
        self._hook_ranges()
        self._hook_optimizer()
        self.provisional = self.prof = self.new_session(False)
        start_profiler(self.torch, self.prof)
        self.guard.active = True
        self._arm_timer()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.finish()
        finally:
            self._unhook()
            self.guard.__exit__(*exc)

    def _hook_ranges(self) -> None:
        """Watch ``record_function`` ranges open and close (the key node's end)."""
        cls = self.torch.autograd.profiler.record_function
        enter, leave = cls.__enter__, cls.__exit__
        window = self

        def __enter__(rf: Any) -> Any:
            if window.watching():
                window._before_enter()
                out = enter(rf)
                window.ranges.append(rf)
                window._entered(rf.name)
                return out
            return enter(rf)

        def __exit__(rf: Any, *exc: Any) -> Any:
            if window.watching():
                window._before_exit()
                out = leave(rf, *exc)
                window._forget(rf)
                window._exited(rf.name)
                return out
            window._forget(rf)
            return leave(rf, *exc)

        cls.__enter__, cls.__exit__ = __enter__, __exit__

        def undo() -> None:
            cls.__enter__, cls.__exit__ = enter, leave

        self._undo.append(undo)

    def _forget(self, rf: Any) -> None:
        for k in range(len(self.ranges) - 1, -1, -1):
            if self.ranges[k] is rf:
                del self.ranges[k]
                return

    def _split_open_ranges(self, switch: Callable[[], None]) -> None:
        """Run ``switch`` (a session stops or starts) with the program's open ranges ended
        before it and begun again after it, so each range's records stay in one session.

        A range begun under one session and ended while another recorded made torch
        write through freed memory (a segfault in a later garbage collection: a loop
        inside a ``record_function`` that ended inside the window). Split, the stopped
        session sees the range end at the switch and the next one sees it begin there.
        """
        ops = self.torch.ops.profiler
        split = [rf for rf in self.ranges if getattr(rf, "record", None) is not None]
        for rf in reversed(split):  # innermost first, as ranges nest
            with self.torch._C.DisableTorchFunctionSubclass():
                ops._record_function_exit._RecordFunction(rf.record)
        switch()
        for rf in split:
            rf.record = ops._record_function_enter_new(rf.name, rf.args)

    def _hook_optimizer(self) -> None:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:  # a torch without the global hook: optimizers are no key node
            return
        handle = register_optimizer_step_post_hook(self._optimizer_stepped)
        self._undo.append(handle.remove)

    def _unhook(self) -> None:
        while self._undo:
            self._undo.pop()()
        self._disarm_timer()

    def watching(self) -> bool:
        """Whether a range or step now may be the key node: not inside our own work, and
        on the thread that started the profiler (Kineto stops only there; iterations run
        on another thread are no key node, and the fallback's note says so)."""
        return not self.busy and threading.get_ident() == self.thread

    def _optimizer_stepped(self, optimizer: Any, *_: Any) -> None:
        if not self.watching():
            return
        if self.source is None:
            self.source = "optimizer"
            self.stepped = optimizer
            self.key_name = f"{OPTIMIZER_PREFIX}{type(optimizer).__name__}.step"
        if self.source == "optimizer" and optimizer is self.stepped:
            self.step_pending = True  # its Optimizer.step# range ends next

    def _entered(self, name: str) -> None:
        self.open += 1
        if self.source is None and (name in ITERATION_NAMES or name.startswith(STEP_PREFIX)):
            self.source = "ranges"
            self.key_name = name if name in ITERATION_NAMES else "ProfilerStep#N"
        if self._is_key(name):
            self.depth += 1

    def _exited(self, name: str) -> None:
        self.open = max(self.open - 1, 0)
        self.low = min(self.low, self.open)
        if self.source == "optimizer":
            if self.step_pending and name.startswith(OPTIMIZER_PREFIX):
                self.step_pending = False
                self._key_node_ended()
        elif self._is_key(name):
            self.depth = max(self.depth - 1, 0)
            if self.depth == 0:
                self._key_node_ended()
        self._fire_if_due()

    def _before_enter(self) -> None:
        self._fire_if_due()

    def _before_exit(self) -> None:
        """A range closes: if it holds our open step, close the step first (ranges nest:
        the profiler's records of a range closed out of order crash torch later); the
        step then ends where the program's loop did, and is no iteration."""
        if self.step is not None and self.open - 1 < self.step_level:
            self.busy = True
            try:
                self.partial.append(self._close_step() or "")
            finally:
                self.busy = False

    def _is_key(self, name: str) -> bool:
        if self.source == "node":
            return name == self.key_name
        if self.source == "ranges":
            return name in ITERATION_NAMES or name.startswith(STEP_PREFIX)
        return False

    # --- the window ----------------------------------------------------------------

    @property
    def own_steps(self) -> bool:
        """Whether the window marks its steps (not when the program's ranges are the key node)."""
        return self.source != "ranges"

    def _key_node_ended(self) -> None:
        """An iteration ended: count it; the window's work for it waits for a place where
        our step can close and open at the level it opened (see :meth:`_fire_if_due`)."""
        self.n += 1
        level, self.low = self.low, self.open
        if self.phase == "before" and self.n < self.spec.warmup:
            return  # the warm-up is counted only
        if self.phase in ("before", "window"):
            self.due = True
            # the step goes at the lowest nesting the program reached during the iteration
            # that just ended (0 unless a range holds the whole loop): a range around each
            # whole step (``train_step``) has then closed before our step closes and opens
            self.level = self.open if not self.own_steps else min(level, self.open)

    def _fire_if_due(self) -> None:
        if self.due and self.open <= self.level:
            self.due = False
            self._boundary()

    def _boundary(self) -> None:
        """The window's work at an iteration's end: open, mark the next step, or close."""
        self.busy = True
        try:
            if self.phase == "before":
                self._open()
            elif self.phase == "window":
                self.provisional = None  # the window holds an iteration: no fallback now
                if self.n - self.opened_at >= self.spec.iterations:
                    self._close(ended=False)
                    return
            else:
                return
            self._mark_step()
        finally:
            self.busy = False

    def _mark_step(self) -> None:
        """Close the open step and open ``ProfilerStep#n``, while a session records."""
        self._close_step()
        if self.own_steps and self.prof is not None:
            self.step = self.torch.autograd.profiler.record_function(f"{STEP_PREFIX}{self.n}")
            self.step.__enter__()
            self.step_level = self.open

    def _close_step(self) -> str | None:
        """Close our open step; returns its name (None when none was open)."""
        if self.step is None:
            return None
        step, self.step = self.step, None
        step.__exit__(None, None, None)
        return str(step.name)

    def _stop(self, start: Any = None) -> str | None:
        """Stop the session recording now, if any, and start ``start`` (the window's
        session) in the same switch, so the program's open ranges are split once; returns
        the name of the step left open."""
        open_step = self._close_step()
        old = self.prof
        if old is None and start is None:
            return open_step

        def switch() -> None:
            if old is not None:
                old.stop()  # still self.prof while it stops (the step-aside guard asks)
            self.prof = start
            if start is not None:
                start_profiler(self.torch, start)

        self._split_open_ranges(switch)
        return open_step

    def _open(self) -> None:
        """Stop the provisional session (kept until the window holds an iteration) and
        start the window's."""
        self._disarm_timer()
        self.opened_at = self.n
        self._stop(start=self.new_session(self.with_stack))
        self.phase = "window"
        for o in self.observers:
            o.window_opened()

    def _close(self, *, ended: bool) -> None:
        """Stop the window's session and write the capture; the program goes on unprofiled
        (``ended``: it has ended, inside the window, and the open step is its tail)."""
        prof = self.prof
        open_step = self._stop()
        if ended and open_step is not None:
            self.partial.append(open_step)
        self._write(prof, "short" if ended else "window")
        for o in self.observers:
            o.window_closed(self.out)

    def finish(self) -> None:
        """The program ended: write what the window has, or the provisional capture."""
        if self.due:  # its last iteration ended where no step could be marked yet
            self.due = False
            self._boundary()
        self.busy = True
        if self.phase == "window" and self.provisional is None:
            self._close(ended=True)
        elif self.phase in ("before", "window"):  # the window holds no whole iteration
            self._stop()
            self.partial.clear()  # the provisional session has no steps of ours
            self._write(self.provisional, "fallback")

    def _write(self, prof: Any, kind: str) -> None:
        """Export ``prof`` as the capture, the steps that are no iteration renamed
        :data:`AFTER_LAST_STEP`."""
        self.phase = "done"
        self.guard.active = False
        self._unhook()  # nothing more to watch: no cost for the rest of the program
        rename = [(name, AFTER_LAST_STEP) for name in self.partial if name]
        _export(prof, self.out, rename=rename)
        self.report = self._report(kind)

    def _step_aside(self) -> None:
        """The program started its own profiler: stop ours and write what it has."""
        prof = self.prof or self.provisional
        self._stop()
        self.phase = "aside"
        self._unhook()
        if prof is not None:
            _export(prof, self.out)
        self.report = WindowReport(
            "aside",
            0,
            self.spec.warmup,
            self._key_text(),
            "the program's own profiler session (perfguard's stepped aside)",
        )

    def _ours(self, session: Any) -> bool:
        return any(p is not None and session is p.profiler for p in (self.prof, self.provisional))

    def _report(self, kind: str) -> WindowReport:
        warmup, key = self.spec.warmup, self._key_text()
        if kind in ("window", "short"):
            warmup = self.opened_at
            recorded = min(self.n - warmup, self.spec.iterations)
            detail = f"{_n(recorded, 'iteration')} after {warmup} warm-up"
            note = ""
            if kind == "short":
                note = (
                    f"the program ended after {_n(self.n, 'iteration')} ({key}), inside "
                    f"the window of {self.spec.iterations}: the capture holds {recorded}"
                )
            return WindowReport(kind, recorded, warmup, key, detail, note)
        took = time.monotonic() - self.t0
        if self.cut_at is not None:
            span = f"its first {self.cut_at:.1f} s (of {took:.1f} s)"
        elif self.phase == "before" or self.n < warmup:
            span = f"the whole run ({took:.1f} s)"
        else:
            span = "the run up to the window (its last step not recorded)"
        if self.n == 0:
            why = "no key node"
            because = (
                f"the program never ended a {self.key_name!r} range"
                if self.source == "node"
                else "the program's main thread stepped no torch optimizer and ended no "
                "perfguard.iteration range"
            )
            hint = "mark iterations with perfguard.iteration or pass --key-node NAME"
        else:
            why = f"the program ended after {_n(self.n, 'iteration')}"
            because = f"{key}; the window records from iteration {warmup} on"
            hint = "lower --warmup to capture a window"
        detail = f"{why}: {span}, without Python stacks"
        note = f"{why} ({because}): the capture is {span}, without Python stacks; {hint}"
        return WindowReport(kind, 0, warmup, key, detail, note)

    def _key_text(self) -> str:
        if self.source == "optimizer":
            return f"key node {self.key_name}"
        if self.source == "ranges":
            return f"{self.key_name} ranges"
        if self.source == "node":
            return f"key node {self.key_name}"
        return "no key node"

    # --- the provisional session's bound ---------------------------------------------

    def _arm_timer(self) -> None:
        if not _can_alarm():
            return
        signal.signal(signal.SIGALRM, self._alarm)
        signal.setitimer(signal.ITIMER_REAL, max(self.spec.fallback_s, 0.001))
        self._undo.append(self._restore_alarm)

    def _restore_alarm(self) -> None:
        if signal.getsignal(signal.SIGALRM) == self._alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def _disarm_timer(self) -> None:
        if _can_alarm() and signal.getsignal(signal.SIGALRM) == self._alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _alarm(self, signum: int, frame: Any) -> None:
        """The provisional session ran ``fallback_s``: stop it (kept until the window opens)."""
        if self.phase != "before" or self.prof is None:
            return
        if self.busy:  # inside our own work: try again shortly
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        self.busy = True
        try:
            self.cut_at = time.monotonic() - self.t0
            self._stop()  # no step of ours is open before the window
        finally:
            self.busy = False


def _can_alarm() -> bool:
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
    )


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


@contextmanager
def window_capture(
    torch: Any,
    out: Path,
    device: str,
    spec: WindowSpec,
    *,
    record_shapes: bool = True,
    with_stack: bool = False,
    with_flops: bool = True,
    profile_memory: bool = False,
    observers: Sequence[WindowObserver] = (),
) -> Iterator[TorchWindow]:
    """Run the ``with`` body (the program) under a :class:`TorchWindow` writing ``out``."""

    def session(stack: bool) -> Any:
        return new_profiler(
            torch,
            device,
            record_shapes=record_shapes,
            with_stack=stack,
            with_flops=with_flops,
            profile_memory=profile_memory,
        )

    window = TorchWindow(torch, spec, session, out, with_stack=with_stack, observers=observers)
    with window:
        yield window
    if window.report is not None and window.report.note:
        print(f"perfguard: note: {window.report.note}", file=sys.stderr)
