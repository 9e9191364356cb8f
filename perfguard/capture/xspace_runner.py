"""Run a Python program under the TensorFlow or JAX profiler (``perfguard profile --backend tf``).

    python -m perfguard.capture.xspace_runner --framework tf|jax --output OUT.xplane.pb
        -- (SCRIPT.py | -m MODULE | -c CODE) [ARGS...]

The program runs as ``__main__`` as under the torch runner
(:func:`perfguard.capture.torch_runner.run_target`), with the framework's
profiler on for its whole run; its iterations are the steps it marks itself
(``tf.profiler.experimental.Trace(..., step_num=N)``,
``jax.profiler.StepTraceAnnotation``, Keras ``NvtxCallback(profiler_steps=True)``).
Exit status: the program's; 3 when no profile could be written (unless the
program already failed); 2 for usage errors.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from perfguard.capture.base import (
    Backend,
    RunOptions,
    RunPlan,
    python_runner_env,
    python_target,
)
from perfguard.capture.frameworks import make_capturer
from perfguard.capture.process import Completed
from perfguard.capture.torch_runner import run_target
from perfguard.capture.xspace_capture import XPLANE_SUFFIX
from perfguard.errors import CaptureError

PROG = "python -m perfguard.capture.xspace_runner"
RUNNER_MODULE = "perfguard.capture.xspace_runner"
EXIT_NO_TRACE = 3
#: the module each framework needs, and how to install it
_NEEDS = {
    "tf": ("tensorflow", 'pip install "perfguard[tf]"'),
    "jax": ("jax", 'pip install "perfguard[jax]"'),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(f"{PROG}: error: put `--` before the program to run", file=sys.stderr)
        return 2
    at = args.index("--")
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--framework", choices=sorted(_NEEDS), required=True)
    p.add_argument("--output", required=True, help="the .xplane.pb file to write")
    opts, target = p.parse_args(args[:at]), args[at + 1 :]
    if not target or (target[0] in ("-m", "-c") and len(target) < 2):
        print(f"{PROG}: error: nothing to run after `--`", file=sys.stderr)
        return 2
    cap = make_capturer(opts.framework, Path(opts.output), "auto")
    cap.start()
    status = run_target(target)
    cap.stop()
    if cap.error:
        print(f"perfguard: {cap.error}", file=sys.stderr)
        return status or EXIT_NO_TRACE
    return status


class XSpaceBackend(Backend):
    """Profile a Python program with the TensorFlow (``tf``) or JAX (``jax``) profiler."""

    name = "xspace"

    def __init__(self, framework: str, *, why: str = "") -> None:
        if framework not in _NEEDS:
            raise CaptureError(f"framework must be one of {', '.join(_NEEDS)}, got {framework!r}")
        self.framework = framework
        self.name = framework
        super().__init__(why=why)

    def available(self) -> tuple[bool, str]:
        module, hint = _NEEDS[self.framework]
        if importlib.util.find_spec(module) is None:
            return False, f"{module} is not installed: {hint}"
        return True, f"{module} is installed"

    @property
    def profiler(self) -> str:
        return f"the {self.framework} profiler"

    def plan(
        self, command: list[str], out: Path, options: RunOptions, env: Mapping[str, str] | None
    ) -> RunPlan:
        """The runner over the Python ``command``, writing ``.xplane.pb``."""
        ok, reason = self.available()
        if not ok:
            raise CaptureError(reason)
        out = out.with_name(out.name + XPLANE_SUFFIX)
        argv = [
            sys.executable,
            "-m",
            RUNNER_MODULE,
            "--framework",
            self.framework,
            "--output",
            str(out),
            "--",
            *python_target(command, self.framework),
        ]
        return RunPlan(argv=argv, env=python_runner_env(env), path=out, what="profile")

    def accepts_exit(self, done: Completed, plan: RunPlan, options: RunOptions) -> bool:
        """A program that failed after its profile was written still gave a profile."""
        return plan.path.is_file()


if __name__ == "__main__":
    sys.exit(main())
