"""Host instruction counts of a measured loop: a child process under Valgrind's Callgrind.

The count of instructions a step executes does not depend on the machine's
load or speed, so a change of a fraction of a percent can be judged on a
shared CPU runner where wall time reads ``noisy``. This module is the two
ends of that measurement:

* the parent, :func:`run_callgrind`: runs a command under
  ``valgrind --tool=callgrind`` with instrumentation and collection off at
  the start (``--instr-atstart=no --collect-atstart=no``: the interpreter's
  start-up and ``import torch`` run on Valgrind's plain JIT, measured 67 s
  against 162 s fully instrumented on the 2-core VM) and returns the dump
  file of each measured block by its name;
* the child, :func:`measured`: around the loop of recorded steps, turns
  instrumentation on (once per process), collects garbage, toggles
  collection on, and after the loop toggles it off and dumps the counts
  under the block's name (:mod:`perfguard.capture.client_request`). One
  process measures any number of blocks, so the start-up is paid once per
  session, not per test.

What would make two runs of the same code count differently, and what is
done about it (:data:`DETERMINISTIC_ENV`): string hashes (``PYTHONHASHSEED``
pinned: set and dict order, hence the work of every loop over them),
threads (one OpenMP/MKL/OpenBLAS thread: a pool's spinning and stealing
depend on timing), the address layout (``setarch -R`` where present: hashes
of objects are their addresses), and the environment (:func:`callgrind_env`:
only the variables that configure the program are passed, never a CI run's
ids, the shell's ``PWD`` or a terminal's, since every byte of it is copied
onto the stack and into the interpreter's heap before the first line runs,
and where later objects land decides the type cache's and pointer-keyed hash
tables' collisions and glibc's copy paths: 3,000 bytes more of an unused
variable moved an MLP step by -0.09 %, 10 bytes by -0.01 %, in
``_int_malloc``, ``unicodekeys_lookup_unicode``, ``find_name_in_mro``). The
cache simulator, when on, gets fixed cache sizes (:data:`CACHE_GEOMETRY`) so
the estimated cycles do not follow the host's caches.
"""

from __future__ import annotations

import fnmatch
import gc
import os
import platform
import random
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from perfguard.capture import client_request
from perfguard.capture.process import format_command, run_command
from perfguard.errors import CaptureError

#: the environment that keeps two runs of the same code on the same instructions
DETERMINISTIC_ENV = {
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}
#: fixed simulated caches (32 KiB 8-way L1s, 8 MiB 16-way LL, 64 B lines): without them
#: Callgrind copies the host's, and the estimated cycles would differ between runners
CACHE_GEOMETRY = ("--I1=32768,8,64", "--D1=32768,8,64", "--LL=8388608,16,64")
#: set in the child so the plugin knows it measures instructions (the file prefix)
ENV_OUT = "PERFGUARD_CALLGRIND_OUT"
#: the variables the Callgrind child gets (with :data:`KEPT_PREFIXES` and any the user
#: names): where programs, libraries and Python find things, the locale, the temp folder
KEPT_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONPYCACHEPREFIX",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONWARNINGS",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_VISIBLE_DEVICES",
        # which pytest plugins load: the child starts as its session did
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
        "PYTEST_PLUGINS",
    }
)
#: prefixes of the variables that configure the frameworks and their libraries
KEPT_PREFIXES = (
    "LC_",
    "PERFGUARD_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "NUMEXPR_",
    "XLA_",
    "TF_",
    "JAX_",
    "HF_",
    "TRANSFORMERS_",
    "NVIDIA_",
    "CUDNN_",
    "CUBLAS_",
    "NCCL_",
)
_TRIGGER = re.compile(r"^desc: Trigger: Client Request: (.*)$", re.M)


def valgrind_missing() -> str | None:
    """Why instruction counts cannot be measured here (one line), or None."""
    reason = client_request.supported()
    if reason:
        return reason
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (Debian/Ubuntu: apt-get install valgrind)"
    return None


def callgrind_argv(
    command: Sequence[str], out_dir: str | os.PathLike[str], *, cache_sim: bool = False
) -> list[str]:
    """``command`` under Callgrind, its dumps in ``out_dir`` (``callgrind.out.<pid>[.<n>]``)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise CaptureError(str(valgrind_missing()))
    prefix: list[str] = []
    setarch = shutil.which("setarch")
    if setarch:  # no address randomisation: object hashes and dict order stay put
        prefix = [setarch, platform.machine(), "-R"]
    argv = [
        *prefix,
        valgrind,
        "--tool=callgrind",
        "--instr-atstart=no",
        "--collect-atstart=no",
        "--dump-line=no",
        f"--callgrind-out-file={Path(out_dir) / 'callgrind.out.%p'}",
    ]
    if cache_sim:
        argv += ["--cache-sim=yes", *CACHE_GEOMETRY]
    return [*argv, *command]


def callgrind_env(
    base: Mapping[str, str] | None = None, keep: Iterable[str] = ()
) -> dict[str, str]:
    """The configuring part of ``base`` (default: this process's environment), sorted, with
    :data:`DETERMINISTIC_ENV`: the names in :data:`KEPT_ENV`, those starting with one of
    :data:`KEPT_PREFIXES`, and those matching a pattern of ``keep`` (``fnmatch``, e.g. a
    test's own ``MYAPP_*``). Two sessions of one project on one machine then pass the same
    bytes, whatever CI run, shell or terminal started them."""
    env = dict(os.environ if base is None else base)
    patterns = tuple(keep)
    kept = {
        k: v
        for k, v in sorted(env.items())
        if k in KEPT_ENV
        or k.startswith(KEPT_PREFIXES)
        or any(fnmatch.fnmatchcase(k, p) for p in patterns)
    }
    kept.update(DETERMINISTIC_ENV)
    return kept


@dataclass(frozen=True)
class CallgrindRun:
    """A finished Callgrind child: each measured block's dump file by its name."""

    dumps: dict[str, Path]
    wall_time_s: float
    log: str


def run_callgrind(
    command: Sequence[str],
    out_dir: str | os.PathLike[str],
    *,
    cache_sim: bool = False,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    keep_env: Iterable[str] = (),
    cwd: str | os.PathLike[str] | None = None,
    echo: bool = False,
) -> CallgrindRun:
    """Run ``command`` under Callgrind and return its named dumps. The child's environment is
    :func:`callgrind_env` of ``env`` (default: this process's) and ``keep_env``.

    Raises :class:`CaptureError` (one line, naming the command) when it cannot
    start, runs past ``timeout``, or exits non-zero.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    argv = callgrind_argv(command, out, cache_sim=cache_sim)
    child_env = callgrind_env(env, keep_env)
    child_env[ENV_OUT] = str(out)
    done = run_command(argv, timeout=timeout, env=child_env, cwd=cwd, echo=echo)
    if done.returncode != 0:
        raise CaptureError(
            f"`{format_command(command)}` under callgrind exited with {done.returncode}: "
            f"{done.last_stderr_line or 'no message'}"
        )
    return CallgrindRun(named_dumps(out), done.wall_time_s, done.stderr_tail)


def named_dumps(out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """The dumps in ``out_dir`` made by :func:`measured`, by block name (last one wins)."""
    found: dict[str, tuple[float, Path]] = {}
    for path in Path(out_dir).glob("callgrind.out.*"):
        with path.open("r", encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
        m = _TRIGGER.search(head)
        if m:
            key = m.group(1).strip()
            stamp = path.stat().st_mtime_ns
            if key not in found or stamp >= found[key][0]:
                found[key] = (stamp, path)
    return {k: p for k, (_, p) in found.items()}


def layout_shift(layout: int) -> list[object]:
    """Objects kept alive for a measured block so that everything allocated after them lands
    elsewhere: layout ``0`` allocates nothing, each other one a fixed, seeded set of
    buffers (up to 64 of 1 B-4 KiB: small-object pools and glibc's heap both move). The
    count of a block differs between layouts by the collisions of the type cache and of
    pointer-keyed tables and glibc's alignment-dependent paths; averaging a few layouts
    shrinks that noise, which any code change brings with it (it moves every address)."""
    if layout <= 0:
        return []
    rng = random.Random(layout)
    return [bytearray(rng.randrange(1, 4096)) for _ in range(rng.randrange(1, 64))]


_started = False


@contextmanager
def measured(name: str) -> Iterator[None]:
    """Count the instructions of the block under Callgrind into a dump named ``name``.

    Outside Valgrind this does nothing but collect garbage (so the block runs
    the same code either way). Collection is toggled exactly at the block's
    edges: nothing of the set-up, warm-up or of other tests is counted.
    """
    global _started
    on = client_request.running_on_valgrind()
    if on and not _started:
        client_request.start_instrumentation()
        _started = True
    gc.collect()  # every block starts from the same collector state
    try:
        with _toggled(on):
            yield
    finally:
        if on:
            client_request.dump_stats_at(name)


@contextmanager
def uncounted() -> Iterator[None]:
    """Inside a :func:`measured` block: leave this part out of the count (a step's set-up,
    such as pytest-benchmark's ``pedantic(setup=...)``). Outside Valgrind, nothing."""
    with _toggled(client_request.running_on_valgrind()):
        yield


@contextmanager
def _toggled(on: bool) -> Iterator[None]:
    """Callgrind's collection switched for the block and back after it (``on``: under
    Valgrind; else nothing)."""
    if on:
        client_request.toggle_collect()
    try:
        yield
    finally:
        if on:
            client_request.toggle_collect()


def under_callgrind() -> bool:
    """Whether this process is a Callgrind child started by :func:`run_callgrind`."""
    return bool(os.environ.get(ENV_OUT)) and client_request.running_on_valgrind()
