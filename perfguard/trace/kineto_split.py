"""Read one large Kineto file with two processes: its first half here, the second in a child.

Decoding a piece and turning its events into columns is CPU-bound Python
(msgspec holds the GIL): a 3.2 GB trace keeps one core busy for half a
minute while the other idles. For a large plain-text file, a forked child
starts at the first event boundary after the middle of the file and sends
each piece's tables back as it finishes them; this process reads the first
half meanwhile, stops at that boundary, then appends the child's pieces in
order. The result, notes included, is the one-process reader's.

Whenever the split cannot be trusted (the child fails for any reason, the
boundary is not one this process can stop at, e.g. a ``},{`` inside a
name), this process reads the second half itself, exactly as the serial
reader would: the child is only ever a shortcut.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from perfguard.forking import can_fork
from perfguard.trace.kineto_repair import repair_notes
from perfguard.trace.kineto_stream import BETWEEN_EVENTS, Event, EventStream

#: plain (not gzip) files with at least this much text are read by two processes;
#: below it the fork and the transfer cost more than half the read saves
SPLIT_BYTES = 256 << 20
#: the name prefix of perfguard's helper threads, which do not block a fork
OUR_THREADS = "perfguard-"
#: the name of a helper thread that imports modules: waited for before forking, since
#: a child that imports what it was importing would wait on its lock forever
IMPORT_THREAD = OUR_THREADS + "import"
#: seconds to wait for it
_IMPORT_WAIT_S = 10.0
#: seconds without a message after which the child is given up (and its half read here)
SILENCE_S = 60.0
#: the pipe size asked for (fcntl's F_SETPIPE_SZ, Linux)
_PIPE_BYTES = 1 << 20
#: how far past the middle the first event boundary is looked for
_SEARCH_BYTES = 4 << 20


class Columns(Protocol):
    """What the split reader needs of the reader's tables (``kineto._Columns``)."""

    def add_structs(self, events: list[Event]) -> None: ...

    def take_parts(self) -> dict[str, list[Any]]: ...

    def absorb_parts(self, parts: dict[str, list[Any]]) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def absorb_state(self, state: dict[str, Any]) -> None: ...


def split_worthwhile(path: Path) -> bool:
    """Whether :func:`read_split` would use a second process for ``path``."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            magic = fh.read(2)
    except OSError:
        return False
    return (
        size >= SPLIT_BYTES
        and magic != b"\x1f\x8b"  # a gzip stream cannot be entered in the middle
        and _cpus() >= 2
        and _only_our_threads()
        and can_fork()  # no runtime whose native threads a fork would copy half of
        and sys.platform.startswith("linux")  # fork without exec is unsafe on macOS
    )


def read_split(
    path: Path, cols: Columns, make_columns: Callable[[Path], Columns]
) -> tuple[dict[str, Any], list[str]]:
    """Stream ``path`` into ``cols`` with a child reading the second half:
    ``(top-level object, notes)`` as :func:`kineto_stream.stream_events`."""
    stream = EventStream(path)
    stop = _split_point(path, stream.r.offset) if _imports_settled() else None
    if stop is None:
        return _serial_rest(stream, cols)
    fork = multiprocessing.get_context("fork")
    recv, send = fork.Pipe(duplex=False)
    _widen(send)
    child = fork.Process(
        target=_child, args=(path, stream.head, stop, send, make_columns), daemon=True
    )
    child.start()
    send.close()
    inbox: list[tuple[Any, ...]] = []
    receiver = threading.Thread(target=_receive, args=(recv, inbox), daemon=True)
    receiver.start()
    try:
        stopped = stream.run(cols.add_structs, stop=stop)
        receiver.join()
        if not (stopped and inbox and inbox[-1][0] == "done"):
            inbox.clear()  # the child's pieces, if any: this process reads them again
            return _serial_rest(stream, cols)
        for message in inbox[:-1]:
            cols.absorb_parts(message[1])
        _, top, notes, fixes, state = inbox[-1]
        inbox.clear()
        cols.absorb_state(state)
        return top, repair_notes(stream.fixes + fixes) + stream.notes + notes
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        recv.close()


def _serial_rest(stream: EventStream, cols: Columns) -> tuple[dict[str, Any], list[str]]:
    stream.run(cols.add_structs)
    top, notes = stream.finish(cols.add_structs)
    return top, repair_notes(stream.fixes) + notes


def _split_point(path: Path, after: int) -> int | None:
    """Offset of the ``{`` of the first event that starts past the middle of the file."""
    size = path.stat().st_size
    middle = max(size // 2, after)
    with open(path, "rb") as fh:
        fh.seek(middle)
        window = fh.read(_SEARCH_BYTES)
    m = BETWEEN_EVENTS.search(window)
    return None if m is None else middle + m.end() - 1


def _child(
    path: Path, head: bytes, start: int, send: Connection, make_columns: Callable[[Path], Columns]
) -> None:
    """Read from ``start`` to the end, sending each piece's tables, then the rest."""
    try:
        cols = make_columns(path)
        stream = EventStream(path, start=start, head=head)

        def on_events(events: list[Event]) -> None:
            cols.add_structs(events)
            _send(send, ("piece", cols.take_parts()))

        stream.run(on_events)
        top, notes = stream.finish(on_events)
        _send(send, ("done", top, notes, stream.fixes, cols.state()))
    except BaseException as exc:  # noqa: BLE001 - any failure: the parent reads this half
        try:
            _send(send, ("error", f"{type(exc).__name__}: {exc}"))
        except Exception:  # noqa: BLE001 - the parent is gone
            pass
    finally:
        send.close()


def _receive(recv: Connection, inbox: list[tuple[Any, ...]]) -> None:
    """Collect the child's messages until its last (``done`` or ``error``) or its end.

    Each message is read into one reused buffer rather than a fresh bytes object
    of its size (several MB a piece).
    """
    buf = bytearray(_PIPE_BYTES)
    while True:
        try:
            if not recv.poll(SILENCE_S):  # a piece takes well under a second
                inbox.append(("error", f"the child sent nothing for {SILENCE_S} s"))
                return
            n = recv.recv_bytes_into(buf)
            with memoryview(buf) as view:
                message = pickle.loads(view[:n])
        except multiprocessing.BufferTooShort as exc:  # a larger message: grow for the next
            message = pickle.loads(exc.args[0])
            buf = bytearray(len(exc.args[0]) * 2)
        except (EOFError, OSError):
            inbox.append(("error", "the child ended without a result"))
            return
        inbox.append(message)
        if message[0] != "piece":
            return


def _send(send: Connection, message: tuple[Any, ...]) -> None:
    send.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _widen(conn: Connection) -> None:
    """A pipe of 1 MiB instead of 64 KiB: the receiving thread needs the GIL for each
    read, and while this process decodes it waits for it, so the child would stall."""
    import fcntl  # Unix only, like the split itself (split_worthwhile)

    try:
        fcntl.fcntl(conn.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    except OSError:  # above /proc/sys/fs/pipe-max-size: keep the default
        pass


def _only_our_threads() -> bool:
    """Forking a process with threads is safe only if the child never needs what they
    may hold: the command's own helper threads (progress, a background import) are
    named ``perfguard-...`` and hold nothing the reader uses; any other thread (a
    test runner's, a user's) and the file is read in one process. A child that
    still blocks is given up after :data:`SILENCE_S`."""
    main = threading.main_thread()
    return all(t is main or t.name.startswith(OUR_THREADS) for t in threading.enumerate())


def _imports_settled() -> bool:
    """Wait for the command's background import to finish (a fork taken while it
    holds a module's import lock leaves that lock held in the child)."""
    for t in threading.enumerate():
        if t.name == IMPORT_THREAD:
            t.join(_IMPORT_WAIT_S)
            if t.is_alive():
                return False
    return True


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
