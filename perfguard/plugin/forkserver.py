"""A warm interpreter that forks one child pytest per round (A/B mode, ``--perfguard-isolate``).

Why: a round child's own work is about a second (warm-up, the timing rounds,
one profiled round and its analysis), but a cold one first spends several
seconds importing python's world: torch (and the ``torch._dynamo`` that
``torch.optim`` pulls in), pandas, pytest, perfguard. The server imports the
modules the session itself has loaded, once, and then forks a child per
round. The child goes into its tree, puts the tree first on ``sys.path`` (as
``PYTHONPATH`` does for a fresh interpreter) and runs ``pytest.main``: the
tree's own code is imported fresh in every child, since no module of either
tree is ever preloaded (:func:`preload_names`), and the child's check for
modules of the other tree (:func:`perfguard.plugin.ab.foreign_modules`) still
runs. Measured on the 2-core CI VM (benchmarks/README.md, "A/B children"):
a round child costs about a fifth of a fresh interpreter's time, and its
timing varies between children as much as fresh processes' does.

Forking is refused, and the caller starts fresh interpreters instead, when it
would not be safe: a Python thread running in the server after the imports (a
fork copies one thread, and any lock another one held, the GIL's users
included), or the server failing to start. Native threads are counted but
allowed: importing torch starts an idle one, and forking after ``import
torch`` is what its own DataLoader workers do. TensorFlow, Keras and JAX are
never preloaded (their runtimes start busy thread pools at import); a child
imports them itself.

The protocol is JSON lines over the server's stdin/stdout (kept on private
descriptors: the server's fd 1 goes to its stderr, so a module printing at
import cannot corrupt it): one ``{"preload": [...]}`` answered by
``{"ready": bool, ...}``, then per round a request answered first by
``{"pid": N}`` and then by ``{"pid": N, "status": S}`` (a return code, or
minus the signal number, as :attr:`subprocess.Popen.returncode`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from perfguard.forking import FORK_UNSAFE

#: seconds the server may take to import its preload list
START_TIMEOUT = 300.0


def preload_names(exclude_roots: list[Path]) -> list[str]:
    """Names of the modules this process has loaded from files outside ``exclude_roots``
    (the trees: their code must be imported fresh by each child), minus
    :data:`~perfguard.forking.FORK_UNSAFE` ones, in load order."""
    roots = [os.path.realpath(r) + os.sep for r in exclude_roots]
    names = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if name == "__main__" or not isinstance(path, str) or not os.path.isabs(path):
            continue
        if name.partition(".")[0] in FORK_UNSAFE:
            continue
        real = os.path.realpath(path)
        if any(real.startswith(r) for r in roots):
            continue
        names.append(name)
    return names


def _native_threads() -> int:
    """Threads of this process, native ones included (``threading`` sees only Python's)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


# ------------------------------------------------------------------------ the server


def serve() -> None:  # pragma: no cover - runs in the server process (tested end to end)
    """The server's main loop (``python -c 'from perfguard.plugin.forkserver import serve;
    serve()'``)."""
    # Ctrl-C reaches the whole foreground group: the session stops the child and closes
    # the server; the server must not die first and leave its child running unwatched
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    proto_in, proto_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)  # stray prints at import go to stderr, never into the protocol
    start_path = list(sys.path)
    reader = os.fdopen(proto_in, "r", encoding="utf-8")

    def say(obj: dict[str, Any]) -> None:
        os.write(proto_out, (json.dumps(obj) + "\n").encode())

    first = json.loads(reader.readline() or "{}")
    t0, failed = time.monotonic(), 0
    import importlib

    for name in first.get("preload", []):
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a module that cannot load alone is skipped
            failed += 1
    import gc
    import threading

    # the preloaded objects never change: a child's collections (one between rounds)
    # skip them, and do not write to (copy) their pages
    gc.freeze()
    threads = threading.active_count()
    say(
        {
            "ready": threads == 1,
            "threads": threads,
            "native_threads": _native_threads(),
            "failed": failed,
            "seconds": round(time.monotonic() - t0, 2),
        }
    )
    if threads != 1:
        return
    for line in reader:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req, start_path, (proto_in, proto_out))
        say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        say({"pid": pid, "status": code})


def _child(req: dict[str, Any], start_path: list[str], proto: tuple[int, int]) -> None:
    """In the forked child: become the round's pytest, never return."""
    code = 70
    try:
        os.setpgid(0, 0)  # its own group: a timeout kills whatever it started too
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in proto:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        # as `python -m pytest` in cwd with PYTHONPATH=lead: cwd, then lead, then the rest;
        # the server's own first entry (its cwd, or '' for -c) is dropped
        rest = [p for p in start_path[1:] if p not in req["lead"]]
        sys.path[:] = [req["cwd"], *req["lead"], *rest]
        sys.argv = ["pytest", *req["args"]]
        if "pair" in req:  # both trees' sessions, their steps interleaved
            from perfguard.plugin.interleave import run_pair

            code = run_pair(req)
        else:
            import pytest

            # plugins preloaded by the server cannot be assertion-rewritten (pytest warns)
            args = [*req["args"], "-W", "ignore::pytest.PytestAssertRewriteWarning"]
            code = int(pytest.main(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report it in the child's log, exit non-zero
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# ------------------------------------------------------------------------ the client


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ForkServer:
    """The session's handle on one server process; :meth:`start` before :meth:`run`."""

    def __init__(self, preload: list[str], cwd: Path, log: Path) -> None:
        self.preload = preload
        self.cwd = cwd
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.why_not: str | None = None  # set when forking is unusable
        self.start_seconds = 0.0
        self._buf = b""

    def start(self) -> bool:
        """Start the server and let it import; False (and :attr:`why_not`) when unusable."""
        self.cwd.mkdir(parents=True, exist_ok=True)
        code = "from perfguard.plugin.forkserver import serve; serve()"
        try:
            with open(self.log, "wb") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", code],
                    cwd=self.cwd,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                )
            self._send({"preload": self.preload})
            ready = self._receive(START_TIMEOUT)
        except (OSError, ValueError, TimeoutError) as exc:
            return self._unusable(f"the fork server did not start: {exc}")
        if ready is None:
            return self._unusable(f"the fork server exited while importing (log: {self.log})")
        self.start_seconds = float(ready.get("seconds", 0.0))
        if not ready.get("ready"):
            return self._unusable(
                f"{ready.get('threads')} Python threads were running after the imports, and a "
                "fork copies only one"
            )
        return True

    def _unusable(self, why: str) -> bool:
        self.why_not = why
        self.close()
        return False

    def run(
        self,
        *,
        cwd: Path,
        args: list[str],
        env: dict[str, str],
        lead: list[str],
        log: Path,
        timeout: float,
        pair: list[dict[str, Any]] | None = None,
    ) -> int | str:
        """One child: its return code (minus the signal that killed it), or why it was
        stopped (``"timed out after ... s"``). Raises :class:`OSError` when the server died.
        With ``pair``, the child runs both trees' sessions interleaved
        (:mod:`perfguard.plugin.interleave`)."""
        req: dict[str, Any] = {
            "cwd": str(cwd),
            "args": args,
            "env": env,
            "lead": lead,
            "log": str(log),
        }
        if pair is not None:
            req["pair"] = pair
        self._send(req)
        started = self._receive(60.0)
        if started is None or "pid" not in started:
            raise OSError("the fork server stopped answering")
        pid = int(started["pid"])
        try:
            done = self._receive(timeout)
        except TimeoutError:
            _kill_group(pid)
            self._receive(60.0)  # the server reaps it and reports the signal
            return f"timed out after {timeout:g} s"
        except BaseException:  # Ctrl-C or SIGTERM in the session: the child goes too
            _kill_group(pid)
            self.close()
            raise
        if done is None or "status" not in done:
            raise OSError("the fork server stopped answering")
        return int(done["status"])

    def _send(self, obj: dict[str, Any]) -> None:
        if self.proc is None or self.proc.stdin is None:
            raise OSError("the fork server is not running")
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def _receive(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line, None at end of file; :class:`TimeoutError` after ``timeout`` s."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the fork server in {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        """Stop the server (its stdin closes; killed if it does not leave)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
