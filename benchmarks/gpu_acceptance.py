"""One prepared GPU acceptance run of perfguard: everything a lent GPU can tell us in one
call, written under one folder as it goes. Two suites:

``--suite models`` (issue 44, the default): the code people actually train, from
``benchmarks/gpu_models/`` (``models.py`` and its tests; models built from configs with
random weights, nothing downloaded; on the CPU the same code shrunk): a Hugging Face
Llama's training step (bf16 autocast, fused AdamW, SDPA) and inference forward, a
torchvision ResNet-50 training step in channels-last (timm's, else a local ResNet-style
network, where torchvision does not import), a transformer block under ``torch.compile``
(default mode, and ``reduce-overhead``: CUDA graphs). In order of value:

1. ``env``, then ``save``: the five tests in a fresh git repository under
   ``pytest --perfguard`` with the CUDA profiler, saved as the baseline.
2. ``probe`` (``acceptance_probe.py``): each step's plain time and its FLOPs by
   ``FlopCounterMode``, and the device's measured bf16 matmul rate.
3. ``analyze``: ``perfguard analyze`` on each saved capture (kept as fixtures): the top
   GEMMs' Tensor Core share and FLOP efficiency, checked against the probe's count, the
   measured rate and the published peak; the share of replayed CUDA-graph time that is
   attributed to named ops.
4. ``aa1``, the changes (:data:`MODEL_CHANGES`: the attention path, a memory layout, a
   graph break, a logged ``.item()``, compile off, autocast off, AdamW unfused; changes
   of disjoint tests share a session, each test judged on its own against the saved
   commit: two sessions), the other A/A sessions, the noise table.

Per model the summary gives the A/A outcomes and between-session noise, each change's
outcome, what decided it (timing or gates) and the first culprit line of its
``summary.md`` with its call site, the profiled round's cost next to the timed rounds'
and the plain steps' (``phase_s``), the GEMM checks and the graph attribution.

``--suite examples`` (issue 32 item 1, run on an H200 on 2026-11-26):

1. ``env``: ``nvidia-smi -q`` and clocks, torch/CUDA/cuDNN, Python, which of perfguard's
   dependencies import, ``git``, ``ncu``, ``nvcc``.
2. ``save``: the examples (transformer block, CNN train step) copied into a fresh git
   repository and run under ``pytest --perfguard`` with the CUDA profiler, saved as the
   baseline.
3. ``traces``, ``graph_capture``: a small model eagerly and replayed from a CUDA graph
   (captured outside the profile; then, in a process of its own, captured inside it),
   gzipped Kineto traces kept as fixtures, each analysed by ``perfguard analyze``
   (``benchmarks/acceptance_model.py``).
4. ``aa1..aaN``: A/A sessions on the unchanged code (saved, append mode: the later ones
   are judged with the noise learnt from history). Expect unchanged or noisy, never
   regressed. The summary gives the real between-session noise of each test's GPU time
   next to the 1 % that the verdict and the calibration assume.
5. ``work5``, ``item``, ``fp32``, ``tf32``: injected changes, each a commit judged
   against the saved base commit: ~5 % more kernel work (an extra matmul sized from the
   measured table), a ``.item()`` per step, the bf16 autocast off, TF32 off.
6. ``compile``, ``compile_ro``: the model under ``torch.compile`` (Inductor default, then
   ``reduce-overhead`` with CUDA graphs), traced and analysed, with Inductor's debug
   folder (output code, provenance mappings) kept.
7. ``ncu``: Nsight Compute on the top kernel of the eager trace, SpeedOfLight, to see
   whether it can read counters there.

Without ``git`` the sessions still run (captures and medians, hence the noise) but
cannot save or name a baseline: each change is then judged by ``perfguard compare`` of
its capture against the first session's. A crash or kill leaves what was done: the
summary, the log and the packed files in ``--out`` are rewritten after every step.
``--out`` only ever holds ``summary.json``, ``summary.md``, ``log.txt``,
``artifacts.tar.gz`` and ``fixtures.tar.gz`` (what comes back from the device: at most 8
files of 16 MB); the working files are in ``--work`` (a temp folder by default).

Duration on one H100/H200, from the parts (benchmarks/README.md): models ~7.5 minutes
under a 440 s deadline, for a device call of ``timeout_s=480``; examples ~6 minutes
(measured: 376 s) under 450 s. The deadline skips what no longer fits, the least
valuable steps last, and packs what there is.

    python3 benchmarks/gpu_acceptance.py --out "$OUT"                   # on the GPU
    python benchmarks/gpu_acceptance.py --dry --out /tmp/acc             # here, on the CPU
    python3 benchmarks/gpu_acceptance.py --suite examples --out "$OUT"  # issue 32's run
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "benchmarks" / "acceptance_model.py"
EXAMPLES = ("conftest.py", "test_transformer_block.py", "test_cnn_train_step.py")
TRANSFORMER = "test_transformer_block.py::test_transformer_block_forward"
CNN = "test_cnn_train_step.py::test_cnn_train_step"
#: what the device returns: at most 8 files of 16 MB each
MAX_FILES, MAX_BYTES = 8, 16 * 1024 * 1024
#: a packed file is kept under this, leaving room for the tar's own overhead
PACK_LIMIT = 15 * 1024 * 1024
#: seconds kept back from the deadline for the last packing
PACK_RESERVE = 10.0
#: perfguard's [project] dependencies and the module each is imported as
DEPENDENCIES = {
    "pandas": "pandas",
    "numpy": "numpy",
    "nvtx": "nvtx",
    "sqlite-utils": "sqlite_utils",
    "jinja2": "jinja2",
    "matplotlib": "matplotlib",
    "pytest": "pytest",
    "scipy": "scipy",
    "msgspec": "msgspec",
    "protobuf": "google.protobuf",
}
#: expected seconds of each step on one H100/H200 (see the module docstring); a step is
#: skipped when less than this is left before the deadline
GPU_ESTIMATE_S = {
    "env": 10,
    "save": 30,
    "traces": 40,
    "graph_capture": 30,
    "aa": 20,
    "noise": 0,
    "change": 20,
    "compile": 60,
    "compile_ro": 50,
    "ncu": 45,
}
#: the same on this project's 2-core CPU machine in --dry mode
DRY_ESTIMATE_S = {
    "env": 4,
    "save": 18,
    "traces": 10,
    "graph_capture": 0,
    "aa": 18,
    "noise": 0,
    "change": 18,
    "compile": 16,
    "compile_ro": 0,
    "ncu": 0,
}
#: the model suite's steps on one H100/H200 (benchmarks/README.md, "Expected duration"): a
#: session of the five tests is its start (Python, torch, transformers, CUDA: ~12 s), two
#: block compiles (Triton, cold: ~20 + 15 s; from Inductor's caches later: ~8 s each),
#: the LM's and the CNN's profiled rounds (5 x 4 steps of ~2,000-4,000 ops: ~10-15 s
#: each with the trace written and analysed); a change session runs only the tests it
#: changes
GPU_MODELS_ESTIMATE_S = {"save": 90, "probe": 40, "analyze": 25, "aa": 65, "change": 45}
#: and in --dry mode here (the five tests shrunk; Inductor's C++ compile of the block)
DRY_MODELS_ESTIMATE_S = {"save": 40, "probe": 20, "analyze": 8, "aa": 25, "change": 20}
WHAT = {
    "examples": "perfguard GPU acceptance run (issue 32 item 1)",
    "models": "perfguard GPU acceptance run on real model code (issue 44)",
}
#: published dense bf16 Tensor Core peaks (TFLOP/s) of the GPUs the device lends, beside
#: which the run also measures one (``acceptance_probe.matmul_rate``); the H200 does 788
#: on an 8192^3 bf16 product through PyTorch (the device notes, 2026-10-28)
SPEC_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4}


@dataclass(frozen=True)
class Change:
    """An injected change: text replacements in one project file, and what should see it."""

    name: str
    file: str
    edits: tuple[tuple[str, str], ...]
    what: str
    test: str  # the test it changes
    expect: str  # the gates (or timing) that should catch it on a GPU
    on_cpu: bool  # whether it changes anything on the CPU (else --dry leaves it out)
    also: tuple[str, ...] = ()  # other tests it changes (the same model code)

    @property
    def tests(self) -> tuple[str, ...]:
        return (self.test, *self.also)


CHANGES = {
    c.name: c
    for c in (
        Change(
            "work5",
            "test_transformer_block.py",
            (
                (
                    "    x = torch.randn(8, 64, 128, device=device)\n",
                    "    x = torch.randn(8, 64, 128, device=device)\n"
                    '    extra_dtype = torch.bfloat16 if device == "cuda" else torch.float32\n'
                    "    extra = torch.randn({n}, {n}, device=device, dtype=extra_dtype)"
                    "  # injected: ~5 % more kernel work\n",
                ),
                (
                    "            y = model(x)\n",
                    "            y = model(x)\n            torch.mm(extra, extra)\n",
                ),
            ),
            "an extra n x n matmul per step, sized to ~5 % of the test's GPU time",
            TRANSFORMER,
            "timing (+5 %), calls, flops",
            True,
        ),
        Change(
            "item",
            "test_cnn_train_step.py",
            (
                (
                    "        losses.append(loss.detach())\n",
                    "        losses.append(loss.detach())\n"
                    "        loss.item()  # injected: a host read (and a sync) per step\n",
                ),
            ),
            "an added loss.item() in the training loop",
            CNN,
            "host_reads, syncs",
            True,
        ),
        Change(
            "fp32",
            "test_transformer_block.py",
            (('enabled=device == "cuda"', "enabled=False"),),
            "the bf16 autocast off: the block runs in float32",
            TRANSFORMER,
            "dtypes, kernel_set, tc_lost, timing",
            False,
        ),
        Change(
            "tf32",
            "conftest.py",
            (
                (
                    "torch.backends.cuda.matmul.allow_tf32 = True",
                    "torch.backends.cuda.matmul.allow_tf32 = False",
                ),
                (
                    "torch.backends.cudnn.allow_tf32 = True",
                    "torch.backends.cudnn.allow_tf32 = False",
                ),
            ),
            "TF32 off for matmuls and cuDNN",
            CNN,
            "tc_lost, kernel_set, timing",
            False,
        ),
    )
}


#: the model project (issue 44): benchmarks/gpu_models/, copied into a fresh repository
MODELS_DIR = ROOT / "benchmarks" / "gpu_models"
MODEL_FILES = ("conftest.py", "models.py", "test_lm.py", "test_cnn.py", "test_compiled.py")
PROBE = ROOT / "benchmarks" / "acceptance_probe.py"
LM_TRAIN = "test_lm.py::test_lm_train_step"
LM_FORWARD = "test_lm.py::test_lm_forward"
CNN_TRAIN = "test_cnn.py::test_cnn_train_step"
COMPILED = "test_compiled.py::test_compiled_block"
COMPILED_RO = "test_compiled.py::test_compiled_block_cudagraphs"
MODEL_TESTS = (LM_TRAIN, LM_FORWARD, CNN_TRAIN, COMPILED, COMPILED_RO)

#: realistic changes to the model code, the kinds a contributor makes, in order of value;
#: changes of disjoint tests share a session (``change_batches``), each judged on its own
#: tests against the saved commit
MODEL_CHANGES = {
    c.name: c
    for c in (
        Change(
            "eager_attn",
            "models.py",
            (('attn_implementation="sdpa"', 'attn_implementation="eager"'),),
            "the Llama's attention path from SDPA (flash) to eager (matmul, softmax, matmul)",
            LM_TRAIN,
            "calls, kernel_set, flops/bytes, timing",
            True,
            also=(LM_FORWARD,),
        ),
        Change(
            "contiguous",
            "models.py",
            (("memory_format=torch.channels_last", "memory_format=torch.contiguous_format"),),
            "the CNN and its images back from channels-last to NCHW",
            CNN_TRAIN,
            "kernel_set (layout transforms), timing",
            True,
        ),
        Change(
            "graph_break",
            "models.py",
            (
                (
                    "        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))\n",
                    "        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))\n"
                    '        print("block", tuple(x.shape))  # a debug print: a graph break\n',
                ),
            ),
            "a debug print in the compiled block's forward: a graph break, two graphs",
            COMPILED,
            "calls (a second compiled graph), kernels, timing",
            True,
            also=(COMPILED_RO,),
        ),
        Change(
            "item",
            "models.py",
            (
                (
                    "            loss = F.cross_entropy(model(images), labels)\n",
                    "            loss = F.cross_entropy(model(images), labels)\n"
                    '        log.info("loss %.4f", loss.item())  # log the loss every step\n',
                ),
            ),
            "the CNN's loss logged with .item() every step: a host read and sync",
            CNN_TRAIN,
            "host_reads, syncs, calls",
            True,
        ),
        Change(
            "no_compile",
            "models.py",
            (("COMPILE = True", "COMPILE = False"),),
            "torch.compile switched off for the block (eager, no CUDA graphs)",
            COMPILED,
            "calls, kernel_set, timing",
            True,
            also=(COMPILED_RO,),
        ),
        Change(
            "fp32",
            "models.py",
            (
                (
                    "with torch.inference_mode(), torch.autocast(device, dtype=AMP):",
                    "with torch.inference_mode(), "
                    "torch.autocast(device, dtype=AMP, enabled=False):",
                ),
            ),
            "the LM's inference forward without bf16 autocast (fp32, TF32 on a GPU)",
            LM_FORWARD,
            "dtypes, kernel_set, bytes, timing",
            True,
        ),
        Change(
            "adamw_foreach",
            "models.py",
            (("weight_decay=0.1, fused=True)", "weight_decay=0.1, foreach=False)"),),
            "AdamW from the fused kernel to the per-parameter loop",
            LM_TRAIN,
            "calls, kernels, timing",
            True,
        ),
    )
}


class Terminated(Exception):
    """SIGTERM (the device's timeout): stop, and pack what there is."""


@dataclass
class Step:
    name: str
    status: str = "pending"  # ok | failed | skipped
    started_s: float | None = None
    wall_s: float | None = None
    note: str = ""
    error: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def tail(text: str, lines: int = 15, chars: int = 2000) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])[-chars:]


class Acceptance:
    """The run: its folders, clock, steps and the files it packs."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry: bool = args.dry
        self.out: Path = args.out.resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work or tempfile.mkdtemp(prefix="pg-acceptance-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.artifacts = self.work / "artifacts"
        self.fixtures = self.work / "fixtures"
        self.logs = self.artifacts / "logs"
        for d in (self.artifacts, self.fixtures, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline: float = args.deadline
        self.suite: str = args.suite
        self.estimates = dict(DRY_ESTIMATE_S if self.dry else GPU_ESTIMATE_S)
        if self.suite == "models":
            self.estimates.update(DRY_MODELS_ESTIMATE_S if self.dry else GPU_MODELS_ESTIMATE_S)
        self.steps: list[Step] = []
        self.summary: dict[str, Any] = {
            "what": WHAT[self.suite],
            "suite": self.suite,
            "dry": self.dry,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "deadline_s": self.deadline,
            "work": str(self.work),
            "steps": [],
            "sessions": [],
            "changes": [],
            "noise": {},
            "traces": [],
            "models": {},
            "packed": {},
        }
        self.child: subprocess.Popen[bytes] | None = None
        self.log_file = open(self.out / "log.txt", "a", buffering=1)  # noqa: SIM115
        self.git_ok = False
        self.project = self.work / "project"
        self.store = self.work / "store.db"
        self.base_sha: str | None = None
        self.base_texts: dict[str, str] = {}

    # ------------------------------------------------------------------ clock, log
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.deadline - self.elapsed()

    def say(self, line: str) -> None:
        text = f"[{self.elapsed():6.1f}s] {line}"
        print(text, flush=True)
        self.log_file.write(text + "\n")

    # ------------------------------------------------------------------ children
    def env(self) -> dict[str, str]:
        """A child's environment: this tree's perfguard first on PYTHONPATH (plus the carried
        wheels already there), no pytest plugin autoloading (``-p perfguard.plugin`` loads
        ours, installed or not; the image's other plugins stay out of the timings)."""
        env = dict(os.environ)
        paths = [str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        for var in [v for v in env if v.startswith("PYTEST_XDIST") or v == "PYTEST_CURRENT_TEST"]:
            env.pop(var)  # run from a test: the sessions are not that test's workers
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if self.dry:
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                env[var] = "1"
        if self.args.pretend_no_git:  # test the no-git path on a machine that has git
            keep = [
                d
                for d in env.get("PATH", "").split(os.pathsep)
                if d and not Path(d, "git").exists()
            ]
            env["PATH"] = os.pathsep.join(keep)
        return env

    def run(
        self,
        argv: list[str],
        name: str,
        timeout: float,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Run a child in its own process group (a timeout kills all of it); its output goes
        to ``logs/<name>.log``. Returns rc (None: timed out), wall seconds and the tail."""
        timeout = max(1.0, min(timeout, self.left() + PACK_RESERVE / 2))
        log = self.logs / f"{name}.log"
        self.say(f"$ {' '.join(argv)}  (timeout {timeout:.0f} s)")
        t = time.monotonic()
        with open(log, "wb") as f:
            self.child = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env or self.env(),
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc: int | None = self.child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
                self.kill_child()
            except BaseException:  # SIGTERM (Terminated) or Ctrl-C: never leave it running
                self.kill_child()
                raise
            finally:
                self.child = None
        wall = time.monotonic() - t
        text = log.read_text(errors="replace")
        self.say(f"  -> rc {rc if rc is not None else 'timeout'} in {wall:.1f} s")
        return {"rc": rc, "wall_s": round(wall, 2), "tail": tail(text), "log": log.name}

    def kill_child(self) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            child.kill()
        child.wait()

    # ------------------------------------------------------------------ steps
    def step(
        self,
        name: str,
        fn: Callable[[Step], None],
        kind: str | None = None,
        needs: str | None = None,
    ) -> Step:
        """Run ``fn`` as step ``name`` unless its estimate no longer fits or ``needs`` (a
        reason) says it cannot run; record the outcome and rewrite the summary."""
        st = Step(name)
        self.steps.append(st)
        estimate = self.estimates.get(kind or name, 30)
        only = self.args.only
        if only and name != "env" and name not in only and (kind or name) not in only:
            st.status, st.note = "skipped", "not in --only"
        elif needs:
            st.status, st.note = "skipped", needs
        elif self.left() < estimate:
            st.status = "skipped"
            st.note = (
                f"deadline: {max(self.left(), 0):.0f} s left of {self.deadline:.0f} s, "
                f"the step needs about {estimate} s"
            )
        if st.status == "skipped":
            self.say(f"== {name}: skipped ({st.note})")
            self.checkpoint()
            return st
        self.say(f"== {name} (about {estimate} s; {self.left():.0f} s left)")
        st.started_s = round(self.elapsed(), 1)
        t = time.monotonic()
        try:
            fn(st)
            if st.status == "pending":
                st.status = "ok"
        except Terminated:
            st.status, st.error = "failed", "terminated (SIGTERM) while running"
            raise
        except Exception:  # noqa: BLE001 (a step's failure is recorded, the run goes on)
            st.status = "failed"
            st.error = tail(traceback.format_exc())
            self.say(f"   {name} failed: {st.error.splitlines()[-1]}")
        finally:
            st.wall_s = round(time.monotonic() - t, 1)
            self.say(f"== {name}: {st.status} in {st.wall_s} s {st.note}".rstrip())
            self.checkpoint()
        return st

    def checkpoint(self) -> None:
        """Rewrite summary.json/summary.md and the packed files: a kill loses one step."""
        self.summary["steps"] = [vars(s) for s in self.steps]
        self.summary["elapsed_s"] = round(self.elapsed(), 1)
        if self.suite == "models":
            try:
                self.models_report()
            except Exception:  # noqa: BLE001 (the report must never end the run)
                self.say("models report failed: " + tail(traceback.format_exc(), 3))
        try:
            self.pack()
        except Exception:  # noqa: BLE001 (packing must never end the run)
            self.say("packing failed: " + tail(traceback.format_exc(), 3))
        write_atomic(self.out / "summary.json", json.dumps(self.summary, indent=1, default=str))
        write_atomic(self.out / "summary.md", markdown(self.summary))

    # ------------------------------------------------------------------ packing
    def pack(self) -> None:
        packed = {}
        for name, folder in (
            ("artifacts.tar.gz", self.artifacts),
            ("fixtures.tar.gz", self.fixtures),
        ):
            packed[name] = pack_folder(folder, self.out / name, PACK_LIMIT)
        ours = {*packed, "summary.json", "summary.md", "log.txt"}
        extra = sorted(p.name for p in self.out.iterdir() if p.name not in ours)
        self.summary["packed"] = {"files": packed, "other_files_in_out": extra}

    # ------------------------------------------------------------------ 1. environment
    def step_env(self, st: Step) -> None:
        info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
        for label, argv in (
            ("git", ["git", "--version"]),
            (
                "nvidia_smi_clocks",
                [
                    "nvidia-smi",
                    "--query-gpu=name,clocks.sm,clocks.mem,"
                    "clocks.max.sm,power.draw,temperature.gpu,driver_version",
                    "--format=csv",
                ],
            ),
            ("ncu", ["ncu", "--version"]),
            ("nvcc", ["nvcc", "--version"]),
            ("cxx", ["c++", "--version"]),
            ("cc", ["cc", "--version"]),  # Triton builds its launcher with it
        ):
            info[label] = quick(argv)
        self.git_ok = info["git"]["rc"] == 0 and not self.args.pretend_no_git
        if not self.git_ok:
            why = "pretended (--pretend-no-git)" if self.args.pretend_no_git else "not found"
            self.say(
                f"!! git {why}: sessions run without saving or a baseline; changes are "
                "judged by perfguard compare of captures instead"
            )
        smi = quick(["nvidia-smi", "-q"], timeout=30, keep=200_000)
        (self.artifacts / "nvidia-smi-q.txt").write_text(smi.pop("output", "") or "")
        info["nvidia_smi_q_rc"] = smi["rc"]
        code = (
            "import json, importlib, importlib.metadata as md\n"
            f"deps = {DEPENDENCIES!r}\n"
            "out = {}\n"
            "for dist, mod in deps.items():\n"
            "    try:\n"
            "        importlib.import_module(mod); ok = True; err = None\n"
            "    except Exception as e:\n"
            "        ok = False; err = f'{type(e).__name__}: {e}'[:300]\n"
            "    try: ver = md.version(dist)\n"
            "    except Exception: ver = None\n"
            "    out[dist] = {'imports': ok, 'version': ver, 'error': err}\n"
            "import torch\n"
            "t = {'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
            "     'cuda_available': torch.cuda.is_available(),\n"
            "     'cudnn': torch.backends.cudnn.version() if torch.backends.cudnn.is_available()"
            " else None}\n"
            "if torch.cuda.is_available():\n"
            "    p = torch.cuda.get_device_properties(0)\n"
            "    t.update(gpu=p.name, sm_count=p.multi_processor_count,\n"
            "             memory_bytes=p.total_memory, capability=f'{p.major}.{p.minor}')\n"
            "try:\n"
            "    import triton; t['triton'] = triton.__version__\n"
            "except Exception: t['triton'] = None\n"
            "try:\n"
            "    import perfguard, perfguard.plugin; t['perfguard_from'] = perfguard.__file__\n"
            "except Exception as e:\n"
            "    t['perfguard_error'] = f'{type(e).__name__}: {e}'[:300]\n"
            "print(json.dumps({'deps': out, 'torch': t}))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=min(120, self.left()),
            check=False,
        )
        if done.returncode == 0:
            info.update(json.loads(done.stdout.strip().splitlines()[-1]))
        else:
            info["probe_error"] = tail(done.stderr)
        self.summary["env"] = info
        missing = [d for d, v in (info.get("deps") or {}).items() if not v["imports"]]
        if missing:
            st.note = f"dependencies that do not import: {', '.join(missing)}"
        self.device = "cuda" if (info.get("torch") or {}).get("cuda_available") else "cpu"
        if not self.dry and self.device != "cuda":
            raise RuntimeError("torch sees no CUDA device; run with --dry on a CPU machine")
        if self.dry:
            self.device = "cpu"
        st.data = {"device": self.device, "git": self.git_ok}

    # ------------------------------------------------------------------ 2. sessions
    def make_project(self) -> None:
        """The suite's files in a fresh repository (a git commit when git is there): the
        examples, or the model project (``benchmarks/gpu_models``, which sizes itself by
        device: nothing to shrink here)."""
        shutil.rmtree(self.project, ignore_errors=True)
        self.project.mkdir(parents=True)
        models = self.suite == "models"
        for name in MODEL_FILES if models else EXAMPLES:
            text = ((MODELS_DIR if models else ROOT / "examples") / name).read_text()
            if self.dry and not models:  # tiny loops on the CPU: the steps, not the CPU
                text = re.sub(r"iterations=\d+, warmup=\d+", "iterations=4, warmup=1", text)
            self.base_texts[name] = text
            (self.project / name).write_text(text)
        (self.project / ".gitignore").write_text(".perfguard/\n__pycache__/\n")
        if self.git_ok:
            git(self.project, "init", "-q")  # (init -b needs git 2.28)
            git(self.project, "symbolic-ref", "HEAD", "refs/heads/main")
            git(self.project, "add", "-A")
            git(self.project, "commit", "-q", "-m", f"base: the perfguard {self.suite}")
            self.base_sha = git(self.project, "rev-parse", "HEAD")

    def session(
        self, st: Step, name: str, kind: str, flags: list[str], change: str | None = None
    ) -> dict[str, Any]:
        """One ``pytest --perfguard`` session in the project; its record in the summary."""
        folder = self.work / "sessions" / name
        shutil.rmtree(folder, ignore_errors=True)
        backend = "torch" if self.device == "cuda" else "cpu"
        # "--opt=PATH": pytest takes its rootdir from any existing path among the
        # arguments, and an outside output folder would move it (and the git state)
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "perfguard.plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            "--perfguard",
            f"--perfguard-backend={backend}",
            f"--perfguard-store={self.store}",
            f"--perfguard-output={folder}",
            "--perfguard-fail-on=never",
            f"--rootdir={self.project}",
            f"--perfguard-rounds={self.args.rounds}",
            *flags,
        ]
        done = self.run(argv, f"session-{name}", self.args.session_timeout, cwd=self.project)
        # sessions slower than planned: start none that cannot end (a models change runs
        # only its tests, so it learns from change sessions alone)
        kinds = ("change",) if kind == "change" else ("aa",)
        if self.suite == "examples":
            kinds = ("aa", "change")
        for k in kinds:
            self.estimates[k] = max(self.estimates[k], math.ceil(done["wall_s"]))
        rec: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "change": change,
            "rc": done["rc"],
            "wall_s": done["wall_s"],
            "flags": flags,
        }
        keep = self.artifacts / "sessions" / name
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.logs / done["log"], keep / "pytest.log")
        results = folder / "results.json"
        if results.is_file():
            doc = json.loads(results.read_text())
            for f in ("results.json", "summary.md"):
                if (folder / f).is_file():
                    shutil.copy(folder / f, keep / f)
            captures = folder / "captures"
            if captures.is_dir():  # a few hundred kB: real GPU pytest captures, kept
                shutil.copytree(captures, keep / "captures", dirs_exist_ok=True)
            rec.update(
                badge=doc.get("badge"),
                complete=doc.get("complete"),
                notes=doc.get("notes"),
                tests=[test_row(t) for t in doc["tests"]],
                baseline_status=doc.get("baseline_status"),
            )
            rec["captures"] = {t["nodeid"]: t.get("capture") for t in doc["tests"]}
        else:
            rec["error"] = done["tail"]
        self.summary["sessions"].append(rec)
        st.data = {k: rec.get(k) for k in ("rc", "wall_s", "badge")}
        st.data["outcomes"] = {t["nodeid"]: t["outcome"] for t in rec.get("tests", [])}
        if done["rc"] not in (0, 1) or not results.is_file():
            raise RuntimeError(f"session {name}: rc {done['rc']}, no results\n{done['tail']}")
        return rec

    def step_save(self, st: Step) -> None:
        self.make_project()
        flags = ["--perfguard-save"] if self.git_ok else []
        self.session(st, "save", "base", flags)
        if not self.git_ok:
            st.note = "no git: measured, not saved (the changes are compared with its captures)"

    def step_aa(self, st: Step, i: int) -> None:
        flags = ["--perfguard-save", "--perfguard-save-mode=append"] if self.git_ok else []
        rec = self.session(st, f"aa{i}", "aa", flags)
        bad = [t["nodeid"] for t in rec.get("tests", []) if t["outcome"] == "regressed"]
        st.data["false_alarm"] = bool(bad)
        if bad:
            st.note = f"A/A FALSE ALARM: {', '.join(bad)} regressed on unchanged code"

    def apply_changes(self, changes: list[Change], size: int | None) -> None:
        """The base texts with every change's edits, committed as one commit."""
        if self.git_ok:
            git(self.project, "checkout", "-q", "--detach", self.base_sha or "HEAD")
        texts = dict(self.base_texts)  # every file back to the base first
        for change in changes:
            text = texts[change.file]
            for old, new in change.edits:
                if old not in text:
                    raise RuntimeError(f"{change.name}: {old.strip()!r} not in {change.file}")
                text = text.replace(old, new.replace("{n}", str(size)))
            texts[change.file] = text
        for name, text in texts.items():
            (self.project / name).write_text(text)
        if self.git_ok:
            what = "; ".join(f"{c.name}: {c.what}" for c in changes)
            git(self.project, "commit", "-q", "-am", what)

    def step_changes(self, st: Step, changes: list[Change]) -> None:
        """One session with ``changes`` applied, judged against the saved commit: the whole
        suite for the examples, the changed tests alone for the models."""
        size, planned = None, None
        if any(c.name == "work5" for c in changes):
            size, planned = self.size_work5()
        self.apply_changes(changes, size)
        flags = [f"--perfguard-baseline={self.base_sha}"] if self.git_ok else []
        if self.suite == "models":  # only the tests the changes touch
            flags += [t for t in MODEL_TESTS if any(t in c.tests for c in changes)]
        name = "+".join(c.name for c in changes)
        rec = self.session(st, name, "change", flags, change=name)
        tests = {t["nodeid"]: t for t in rec.get("tests", [])}
        summary_md = self.artifacts / "sessions" / name / "summary.md"
        md = summary_md.read_text() if summary_md.is_file() else ""
        changed = {t for c in changes for t in c.tests}
        notes = []
        for change in changes:
            if not self.git_ok:
                for nodeid in change.tests:
                    tests[nodeid] = self.compare_captures(nodeid, rec)
            per_test = {}
            for nodeid in change.tests:
                hit = tests.get(nodeid) or {
                    "outcome": "not run",
                    "reason": "not in the session's results.json "
                    "(skipped or not collected: the pytest log says which)",
                }
                per_test[nodeid] = {
                    **{
                        k: hit.get(k)
                        for k in (
                            "outcome",
                            "decided_by",
                            "timing_outcome",
                            "delta_pct",
                            "ci_pct",
                            "gates_fired",
                            "reason",
                        )
                    },
                    **culprit(md, nodeid),
                }
            hit = per_test[change.test]
            row = {
                "change": change.name,
                "what": change.what,
                "test": change.test,
                "session": name,
                "expect": change.expect,
                "outcome": hit["outcome"],
                "caught": hit["outcome"] == "regressed",
                "timing_outcome": hit["timing_outcome"],
                "delta_pct": hit["delta_pct"],
                "ci_pct": hit["ci_pct"],
                "gates_fired": hit["gates_fired"],
                "decided_by": hit["decided_by"],
                "culprit": hit.get("culprit"),
                "call_site": hit.get("call_site"),
                "reason": hit["reason"],
                "matmul_n": size if change.name == "work5" else None,
                "planned_pct": planned if change.name == "work5" else None,
                "tests": per_test,
                "others": {k: v["outcome"] for k, v in tests.items() if k not in changed},
            }
            self.summary["changes"].append(row)
            outcomes = ", ".join(
                f"{k.split('::')[-1]}: {v['outcome']}" for k, v in per_test.items()
            )
            notes.append(
                f"{change.name}: {outcomes} (decided by {hit['decided_by'] or '-'}, "
                f"gates {hit['gates_fired']})"
            )
        st.data.update(
            caught={
                r["change"]: r["caught"] for r in self.summary["changes"] if r["session"] == name
            }
        )
        st.note = "; ".join(notes)

    def size_work5(self) -> tuple[int, float | None]:
        """The matmul size whose measured time is nearest 5 % of the transformer test's
        per-iteration time in the saved session (64 when either is unknown)."""
        base = next((s for s in self.summary["sessions"] if s["name"] == "save"), None)
        level = None
        for t in (base or {}).get("tests", []):
            if t["nodeid"] == TRANSFORMER:
                level = t.get("median_ns")
        table_path = self.fixtures / "mm_sizes.json"
        if not level or not table_path.is_file():
            return 64, None
        table = json.loads(table_path.read_text())["us_per_mm"]
        target_us = 0.05 * level / 1000.0
        sizes = [(int(n), us) for n, us in table.items() if us]
        if not sizes:
            return 64, None
        n, us = min(sizes, key=lambda x: abs(math.log(x[1] / target_us)))
        planned = round(100.0 * us * 1000.0 / level, 2)
        self.say(f"   work5: {n} x {n} matmul, {us:.2f} us = {planned} % of {level / 1e3:.1f} us")
        return n, planned

    def compare_captures(self, nodeid: str, rec: dict[str, Any]) -> dict[str, Any]:
        """No git: ``perfguard compare`` of the changed test's capture with the first
        session's (one profiled round each; gates and a per-iteration timing)."""
        base = next((s for s in self.summary["sessions"] if s["name"] == "save"), {})
        cur_cap = (rec.get("captures") or {}).get(nodeid)
        base_cap = (base.get("captures") or {}).get(nodeid)
        if not cur_cap or not base_cap:
            return {"nodeid": nodeid, "outcome": None, "reason": "no capture to compare"}
        out = self.artifacts / "sessions" / rec["name"] / "compare.json"
        argv = [sys.executable, "-m", "perfguard", "compare", cur_cap, base_cap, "--json", str(out)]
        done = self.run(argv, f"compare-{rec['name']}", 120, cwd=self.work)
        if not out.is_file():
            return {"nodeid": nodeid, "outcome": None, "reason": done["tail"][-300:]}
        tests = json.loads(out.read_text()).get("tests") or [{}]
        return {**test_row({"nodeid": nodeid, **tests[0]}), "judged_by": "perfguard compare"}

    # ------------------------------------------------------------------ noise
    def noise(self) -> None:
        """Between-session noise of each test's level over the sessions of unchanged code."""
        import numpy as np

        sys.path.insert(0, str(ROOT))
        from perfguard.compare.timing import PRIOR_RUN_SD, between_run_sd

        unchanged = [s for s in self.summary["sessions"] if s["kind"] in ("base", "aa")]
        by_test: dict[str, list[dict[str, Any]]] = {}
        for s in unchanged:
            for t in s.get("tests", []):
                if t.get("median_ns"):
                    by_test.setdefault(t["nodeid"], []).append(t)
        out: dict[str, Any] = {}
        for nodeid, rows in by_test.items():
            levels = np.array([r["median_ns"] for r in rows], dtype=float)
            metric = rows[0].get("metric")
            within = [
                float(np.std(np.log(r["rounds"]), ddof=1))
                for r in rows
                if len(r.get("rounds") or []) >= 2
            ]
            n = len(levels)
            out[nodeid] = {
                "metric": metric,
                "sessions": n,
                "levels_ns": [round(float(x), 1) for x in levels],
                "mean_ns": round(float(levels.mean()), 1),
                "sd_over_mean_pct": pct(np.std(levels, ddof=1) / levels.mean()) if n > 1 else None,
                "log_sd_pct": pct(np.std(np.log(levels), ddof=1)) if n > 1 else None,
                "successive_mad_sd_pct": pct(between_run_sd(levels)),
                "within_session_round_sd_pct": pct(float(np.median(within))) if within else None,
                "assumed_prior_sd_pct": pct(PRIOR_RUN_SD.get(metric or "", math.nan)),
            }
        self.summary["noise"] = {"tests": out, "assumed": assumed_sigmas()}

    # ------------------------------------------------------------------ 3/6. traces
    def step_traces(self, st: Step) -> None:
        self.capture_program(
            st, ["traces", "--iters", str(self.args.trace_iters)], "traces", self.args.trace_timeout
        )

    def step_graph_capture(self, st: Step) -> None:
        self.capture_program(
            st,
            ["graph-capture", "--iters", str(self.args.trace_iters)],
            "graph-capture",
            self.args.graph_timeout,
        )

    def step_compile(self, st: Step, mode: str) -> None:
        if self.device == "cpu" and not (shutil.which("c++") or shutil.which("g++")):
            st.status, st.note = "skipped", "no C++ compiler: Inductor cannot build CPU kernels"
            return
        debug = self.work / f"inductor-{mode}"
        env = {
            **self.env(),
            "TORCH_COMPILE_DEBUG": "1",
            "TORCH_COMPILE_DEBUG_DIR": str(debug),
            "TORCH_LOGS": "output_code",
        }
        self.capture_program(
            st,
            ["compile", "--compile-mode", mode, "--iters", str(self.args.trace_iters)],
            f"compile-{mode}",
            self.args.compile_timeout,
            env=env,
        )
        kept = keep_inductor_debug(debug, self.fixtures / f"inductor_{mode.replace('-', '_')}")
        st.data["inductor_files"] = kept

    def capture_program(
        self,
        st: Step,
        args: list[str],
        name: str,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> None:
        before = set(manifest_lines(self.fixtures))
        argv = [
            sys.executable,
            str(MODEL),
            *args,
            "--out",
            str(self.fixtures),
            "--device",
            self.device,
        ]
        done = self.run(argv, name, timeout, cwd=self.work, env=env)
        if name.startswith("compile"):  # TORCH_LOGS=output_code: the kernels' source
            shutil.copy(self.logs / done["log"], self.fixtures / f"{name}.log")
        new = [m for m in manifest_lines(self.fixtures) if m not in before]
        for line in new:
            entry = json.loads(line)
            entry["analyze"] = self.analyze(entry["trace"])
            self.summary["traces"].append(entry)
        self.write_manifest()
        st.data = {"traces": [json.loads(line)["trace"] for line in new], "rc": done["rc"]}
        if done["rc"] != 0:
            st.status = "failed"
            st.error = f"rc {done['rc']}: {len(new)} trace(s) written\n{done['tail']}"

    def analyze(self, trace: str | Path, base: str | None = None) -> dict[str, Any]:
        """``perfguard analyze`` on one trace (a name in the fixtures, or a path): its reports
        into the artifacts, and the top kernels (for ncu), the notes and the summary figures
        into the manifest."""
        path = trace if isinstance(trace, Path) else self.fixtures / trace
        base = base or path.name.removesuffix(".pt.trace.json.gz")
        folder = self.artifacts / "analyze"
        argv = [
            sys.executable,
            "-m",
            "perfguard",
            "analyze",
            "-d",
            str(path),
            "--output-path",
            str(folder),
            "--base-name",
            base,
            "--formats",
            "csv,json",
            "-q",
            "-f",
        ]
        done = self.run(argv, f"analyze-{base}", self.args.analyze_timeout, cwd=self.work)
        res: dict[str, Any] = {"rc": done["rc"], "wall_s": done["wall_s"]}
        if done["rc"] != 0:
            res["error"] = done["tail"][-600:]
            return res
        res["top_kernels"] = top_kernels(folder / f"{base}_kernel.csv")
        text = (self.logs / done["log"]).read_text(errors="replace")
        res["notes"] = [ln[6:] for ln in text.splitlines() if ln.startswith("note: ")]
        summary = folder / f"{base}_summary.json"
        if summary.is_file():
            res["summary"] = json.loads(summary.read_text())
        return res

    def write_manifest(self) -> None:
        """fixtures/manifest.json: every trace, what is in it and how it analysed."""
        doc = {
            "about": "traces made by benchmarks/gpu_acceptance.py (acceptance_model.py): "
            "one model eagerly, from CUDA graphs and compiled; per trace the model, "
            "shapes, iterations, regions and machine",
            "traces": self.summary["traces"],
            "env": {k: (self.summary.get("env") or {}).get(k) for k in ("torch", "python")},
        }
        write_atomic(self.fixtures / "manifest.json", json.dumps(doc, indent=1, default=str))

    # ------------------------------------------------------------------ 7. ncu
    def step_ncu(self, st: Step) -> None:
        if not shutil.which("ncu"):
            st.status, st.note = "skipped", "ncu not on PATH"
            return
        eager = next((t for t in self.summary["traces"] if t["name"] == "eager"), None)
        kernels = ((eager or {}).get("analyze") or {}).get("top_kernels") or []
        attempts: list[list[str]] = []
        if kernels:
            word = re.escape(kernel_word(kernels[0]["short_name"] or kernels[0]["name"]))
            attempts.append(["--kernel-name", f"regex:{word}", "--launch-count", "1"])
        attempts.append(["--launch-skip", "20", "--launch-count", "1"])
        results: list[dict[str, Any]] = []  # the attempts made: those after a success are not
        for i, extra in enumerate(attempts):
            argv = [
                "ncu",
                "--target-processes",
                "all",
                "--clock-control",
                "none",
                "--section",
                "SpeedOfLight",
                "--csv",
                "--kernel-name-base",
                "demangled",
                *extra,
                sys.executable,
                str(MODEL),
                "run",
                "--iters",
                "3",
                "--device",
                self.device,
            ]
            done = self.run(argv, f"ncu-{i}", self.args.ncu_timeout, cwd=self.work)
            text = (self.logs / done["log"]).read_text(errors="replace")
            rows = [ln for ln in text.splitlines() if ln.startswith('"')]
            result = {
                "argv": argv,
                "rc": done["rc"],
                "csv_rows": len(rows),
                "counters_read": len(rows) > 1 and "ERR_NVGPUCTRPERM" not in text,
                "tail": done["tail"][-800:],
            }
            results.append(result)
            if result["counters_read"]:
                (self.artifacts / "ncu.csv").write_text("\n".join(rows) + "\n")
                break
        self.summary["ncu"] = results
        st.data = {"counters_read": any(a["counters_read"] for a in results)}
        st.note = "counters read" if st.data["counters_read"] else "no counters read"

    # ------------------------------------------------------------------ models: probe, analyze
    def step_probe(self, st: Step) -> None:
        """The independent side (``acceptance_probe.py``): each base step's plain time and
        FlopCounterMode's FLOPs, and the device's measured bf16 matmul rate."""
        out = self.artifacts / "probe.json"
        env = self.env()
        if self.device == "cpu":  # the sessions' compiled C++ (and Inductor's cache key)
            env["TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"] = "1"
        argv = [
            sys.executable,
            str(PROBE),
            "--project",
            str(self.project),
            "--device",
            self.device,
            "--out",
            str(out),
            "--steps",
            "3" if self.dry else "10",
        ]
        done = self.run(argv, "probe", self.args.probe_timeout, cwd=self.work, env=env)
        doc = json.loads(out.read_text()) if out.is_file() else {}
        self.summary["probe"] = doc
        errors = [n for n, v in (doc.get("steps") or {}).items() if "error" in v]
        st.data = {"rc": done["rc"], "matmul": doc.get("matmul"), "errors": errors}
        st.note = f"bf16 matmul {(doc.get('matmul') or {}).get('tflops')} TFLOP/s"
        if done["rc"] != 0 or errors:
            st.status = "failed"
            st.error = f"rc {done['rc']}, failed steps {errors}\n{done['tail']}"

    def step_models_analyze(self, st: Step) -> None:
        """``perfguard analyze`` on each test's capture of the saved session: the top GEMMs'
        Tensor Core share and FLOP efficiency, the replayed-graph note. The captures move
        to the fixtures (the first real-model GPU captures)."""
        save: dict[str, Any] = next(
            (s for s in self.summary["sessions"] if s["name"] == "save"), {}
        )
        keep = self.fixtures / "captures"
        keep.mkdir(parents=True, exist_ok=True)
        done: list[str] = []
        bad: list[str] = []
        for nodeid, cap in (save.get("captures") or {}).items():
            if not cap or not Path(cap).is_file():
                continue
            for p in Path(cap).parent.glob(Path(cap).name + "*"):  # the trace and sidecar
                shutil.copy(p, keep / p.name)
                moved = self.artifacts / "sessions" / "save" / "captures" / p.name
                moved.unlink(missing_ok=True)
            short = nodeid.split("::")[-1]
            res = self.analyze(keep / Path(cap).name, base=short)
            folder = self.artifacts / "analyze"
            res["gemms"] = gemm_rows(folder / f"{short}_detail.csv")
            res["detail_flops"] = op_flops(folder / f"{short}_detail.csv")
            res["graph_replay"] = graph_replay(
                res.get("notes") or [], folder / f"{short}_detail.csv"
            )
            res.pop("top_kernels", None)
            self.summary["models"].setdefault(nodeid, {})["analyze"] = res
            (done if res.get("rc") == 0 else bad).append(short)
        st.data = {"analysed": done}
        if bad:
            st.status, st.error = "failed", f"analyze failed on {bad}"

    def models_report(self) -> None:
        """Per model: A/A outcomes and noise, each change's verdict and culprit, the
        profiled round's cost, the top GEMMs checked, the replayed graphs' attribution."""
        probe = (self.summary.get("probe") or {}).get("steps") or {}
        peak = (self.summary.get("probe") or {}).get("matmul") or {}
        gpu = ((self.summary.get("env") or {}).get("torch") or {}).get("gpu") or ""
        spec = next((v for k, v in SPEC_BF16_TFLOPS.items() if k in gpu), None)
        save: dict[str, Any] = next(
            (s for s in self.summary["sessions"] if s["name"] == "save"), {}
        )
        for nodeid in MODEL_TESTS:
            m = self.summary["models"].setdefault(nodeid, {})
            short = nodeid.split("::")[-1]
            row = next((t for t in save.get("tests") or [] if t["nodeid"] == nodeid), None)
            m["save"] = row and {k: row[k] for k in ("outcome", "median_ns", "metric")}
            m["aa"] = [
                t["outcome"]
                for s in self.summary["sessions"]
                if s["kind"] == "aa"
                for t in s.get("tests") or []
                if t["nodeid"] == nodeid
            ]
            m["noise"] = ((self.summary.get("noise") or {}).get("tests") or {}).get(nodeid)
            m["changes"] = [
                {"change": c["change"], **c["tests"][nodeid]}
                for c in self.summary["changes"]
                if nodeid in c["tests"]
            ]
            p = probe.get(short) or {}
            m["probe"] = p and {
                k: p.get(k)
                for k in ("plain_ms", "flops_total", "source", "skipped", "error", "counted")
            }
            m["cost"] = round_cost(row, p.get("plain_ms")) if row else None
            a = m.get("analyze") or {}
            iters = ((a.get("summary") or {}).get("Iterations")) or None
            m["flops"] = flop_check(a.get("detail_flops") or {}, iters, p.get("flops_by_op"))
            m["gemms"] = [
                {**g, **gemm_check(g, peak.get("tflops"), spec)} for g in a.get("gemms") or []
            ]

    # ------------------------------------------------------------------ the run
    def main(self) -> None:
        self.say(
            f"perfguard GPU acceptance run{' (dry, CPU)' if self.dry else ''}: out "
            f"{self.out}, work {self.work}, deadline {self.deadline:.0f} s"
        )
        self.device = "cpu"
        env = self.step("env", self.step_env)
        if env.status != "ok" and not self.dry:
            self.say("!! no usable GPU environment: stopping")
            return
        save = self.step("save", self.step_save)
        sessions_ok = save.status == "ok"
        no_session = None if sessions_ok else "the base session failed"
        if self.suite == "models":
            self.main_models(no_session)
            return
        self.step("traces", self.step_traces)
        self.step(
            "graph_capture",
            self.step_graph_capture,
            needs="CUDA graphs need a GPU" if self.device != "cuda" else None,
        )
        for i in range(1, self.args.aa + 1):
            self.step(f"aa{i}", lambda st, i=i: self.step_aa(st, i), kind="aa", needs=no_session)
        self.step("noise", lambda st: self.noise(), needs=no_session)
        for name in self.args.changes:
            change = CHANGES[name]
            needs = no_session
            if self.dry and not change.on_cpu:
                needs = "changes nothing on the CPU (CUDA-only code path)"
            self.step(
                name, lambda st, c=change: self.step_changes(st, [c]), kind="change", needs=needs
            )
        self.step("compile", lambda st: self.step_compile(st, "default"))
        self.step(
            "compile_ro",
            lambda st: self.step_compile(st, "reduce-overhead"),
            needs="reduce-overhead is CUDA graphs: GPU only" if self.dry else None,
        )
        self.step("ncu", self.step_ncu, needs="no GPU (dry run)" if self.dry else None)

    def main_models(self, no_session: str | None) -> None:
        """The model suite after its save, in order of value: the probe and the analysis
        of the saved captures, one A/A, the changes (disjoint ones sharing a session), the
        other A/As, the noise table."""
        self.step("probe", self.step_probe)
        self.step("analyze", self.step_models_analyze, needs=no_session)

        def aa(i: int) -> None:
            self.step(f"aa{i}", lambda st: self.step_aa(st, i), kind="aa", needs=no_session)

        if self.args.aa:
            aa(1)
        for batch in change_batches([MODEL_CHANGES[n] for n in self.args.changes]):
            self.step(
                "+".join(c.name for c in batch),
                lambda st, b=batch: self.step_changes(st, b),
                kind="change",
                needs=no_session,
            )
        for i in range(2, self.args.aa + 1):
            aa(i)
        self.step("noise", lambda st: self.noise(), needs=no_session)


# ---------------------------------------------------------------------- helpers
def pct(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(100.0 * float(x), 3)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=perfguard-acceptance",
            "-c",
            "user.email=acceptance@perfguard.invalid",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()}")
    return done.stdout.strip()


def quick(argv: list[str], timeout: float = 20, keep: int = 4000) -> dict[str, Any]:
    """A small command's rc and output (rc None: not installed or timed out)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return {"rc": None, "output": f"{argv[0]}: not found"}
    except subprocess.TimeoutExpired:
        return {"rc": None, "output": f"{argv[0]}: timed out after {timeout} s"}
    return {"rc": done.returncode, "output": (done.stdout + done.stderr).strip()[:keep]}


def test_row(t: dict[str, Any]) -> dict[str, Any]:
    """What the summary keeps of one results.json test entry (compare/results.py, schema 2)."""
    timing = t.get("timing") or {}
    gates = t.get("gates") or {}
    fired = sorted({r.get("gate") for r in gates.get("regressions") or []} - {None})
    lo, hi = timing.get("ci_low_pct"), timing.get("ci_high_pct")  # the figures' one home
    return {
        "nodeid": t.get("nodeid"),
        "outcome": t.get("outcome"),
        "reason": (t.get("message") or t.get("error") or "")[:500],
        "metric": timing.get("metric"),
        "median_ns": timing.get("median_current_ns"),
        "baseline_ns": timing.get("median_baseline_ns"),
        "delta_pct": timing.get("delta_pct"),
        "ci_pct": [lo, hi] if lo is not None else None,
        "timing_outcome": timing.get("outcome"),
        "noise_pct": timing.get("noise_pct"),
        "history_runs": timing.get("history_runs"),
        "gates_outcome": gates.get("outcome"),
        "gates_fired": fired,
        "gate_messages": [r.get("message") for r in gates.get("regressions") or []][:6],
        "rounds": t.get("rounds_current") or [],
        "samples": len(t.get("samples_current") or []),
        "decided_by": (t.get("explanation") or {}).get("decided_by"),
        "lead": (t.get("explanation") or {}).get("lead"),
        "phase_s": t.get("phase_s") or {},
    }


#: a call site as the explanation writes it: ``at models.py:12 in Net.forward`` (the call-site
#: pass's statement), ``at models.py:12-15 in f`` (lines of one function), or a capture's
#: own ``in forward() at models.py:12``
CALL_SITE = re.compile(
    r"(?:in (?P<old>[\w.<>]+)\(\) )?at (?P<site>[\w./-]+\.py:\d+(?:-\d+)?)"
    r"(?: in (?P<fn>[\w.<>]+))?"
)


#: summary.md's escapes of Markdown punctuation (``\_``, ``\#``), undone in the summary
MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>~])")


def culprit(summary_md: str, nodeid: str) -> dict[str, Any]:
    """The first culprit line ``summary.md`` gives a test (its bullet's text after the test's
    name) and the call site in it, if any."""
    for line in summary_md.splitlines():
        head = f"`{nodeid}`"
        if line.lstrip().startswith("- ") and head in line:
            text = html.unescape(MD_ESCAPE.sub(r"\1", line.split(head, 1)[1].lstrip(": ").strip()))
            m = CALL_SITE.search(text)
            site = None
            if m and m["old"]:
                site = f"{m['old']}() at {m['site']}"
            elif m:
                site = m["site"] + (f" in {m['fn']}" if m["fn"] else "")
            return {"culprit": text[:400], "call_site": site}
    return {"culprit": None, "call_site": None}


def change_batches(changes: list[Change]) -> list[list[Change]]:
    """The changes grouped into sessions, in their order: each joins the first group none
    of whose changes touches its tests (each test is judged on its own, against the saved
    commit, so changes of disjoint tests cannot see each other)."""
    batches: list[list[Change]] = []
    for c in changes:
        free = (b for b in batches if not {t for x in b for t in x.tests} & set(c.tests))
        batch = next(free, None)
        if batch is None:
            batches.append([c])
        else:
            batch.append(c)
    return batches


def read_detail(path: Path) -> list[dict[str, str]]:
    import csv

    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(value: str | None) -> float | None:
    try:
        x = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return x if x is not None and math.isfinite(x) else None


def gemm_rows(detail_csv: Path, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` Tensor-Core-eligible ops with FLOPs that took the most GPU time (CPU time
    where the capture has no GPU), from ``perfguard analyze``'s detail report."""
    rows = [
        r
        for r in read_detail(detail_csv)
        if r.get("TC Eligibility") == "True" and (_num(r.get("FLOPs")) or 0) > 0
    ]
    on_gpu = any((_num(r.get("Total GPU Time (ns)")) or 0) > 0 for r in rows)
    key = "Total GPU Time (ns)" if on_gpu else "Total CPU Time (ns)"
    rows.sort(key=lambda r: -(_num(r.get(key)) or 0))
    return [
        {
            "op": r["Op Name"],
            "direction": r.get("Direction"),
            "dtype": r.get("Data Type"),
            "shapes": (r.get("Input Shapes") or "")[:120],
            "calls": _num(r.get("No. Calls")),
            "gpu_ns": _num(r.get("Total GPU Time (ns)")),
            "cpu_ns": _num(r.get("Total CPU Time (ns)")),
            "kernels": _num(r.get("No. Kernels")),
            "using_tc": r.get("Using TC") == "True",
            "tc_pct": _num(r.get("TC Utilization (%)")),
            "flops": _num(r.get("FLOPs")),
            "tflops": _num(r.get("Achieved TFLOP/s")),
            "eff_pct": _num(r.get("FLOP Efficiency (%)")),
            "call_site": r.get("Call Site") or None,
        }
        for r in rows[:n]
    ]


def op_flops(detail_csv: Path) -> dict[str, list[Any]]:
    """Each op path with FLOPs in the detail report: its FLOPs and Tensor Core eligibility."""
    out: dict[str, list[Any]] = {}
    for r in read_detail(detail_csv):
        f = _num(r.get("FLOPs")) or 0
        if f > 0:
            prev = out.get(r["Op Name"], [0.0, False])
            out[r["Op Name"]] = [prev[0] + f, prev[1] or r.get("TC Eligibility") == "True"]
    return out


#: an op that does matrix work, by its aten name
MATRIX_OP = re.compile(r"attention|convolution|matmul|einsum|linear|mm")


def flop_check(
    detail: dict[str, list[Any]], iterations: int | None, counted: dict[str, int] | None
) -> dict[str, Any] | None:
    """perfguard's FLOPs per iteration beside FlopCounterMode's per step, op by op: an op
    path counts for a counted aten op when it names that op (perfguard gives an op's
    FLOPs once, to one range of its chain); ``unmatched`` is the matrix FLOPs (a Tensor-
    Core-eligible op, or a GEMM, convolution or attention by name) of paths that name no
    counted op: an attention counted on an outer range, or one FlopCounterMode does not
    know (the CPU's flash attention)."""
    if not counted or not iterations:
        return None
    per_op: dict[str, dict[str, Any]] = {}
    matched: set[str] = set()
    for op, ref in sorted(counted.items(), key=lambda kv: -kv[1]):
        paths = [p for p in detail if op in p.split("/")]
        matched.update(paths)
        ours = sum(detail[p][0] for p in paths) / iterations
        per_op[op] = {
            "perfguard": ours,
            "flop_counter": ref,
            "ratio": round(ours / ref, 4) if ref else None,
        }
    ours = sum(v["perfguard"] for v in per_op.values())
    ref = sum(counted.values())
    rest: dict[str, float] = {}
    for p, (f, eligible) in detail.items():
        leaf = p.split("/")[-1]
        if p not in matched and (eligible or MATRIX_OP.search(leaf)):
            rest[leaf] = rest.get(leaf, 0.0) + f / iterations
    return {
        "per_op": per_op,
        "perfguard": ours,
        "flop_counter": ref,
        "ratio": round(ours / ref, 4) if ref else None,
        "unmatched": rest,
    }


def gemm_check(g: dict[str, Any], measured: float | None, spec: float | None) -> dict[str, Any]:
    """A GEMM's achieved rate against the peak perfguard divided by (implied by its FLOP
    efficiency), the device's measured bf16 matmul rate and the published peak."""
    tf, eff = g.get("tflops"), g.get("eff_pct")
    out: dict[str, Any] = {
        "implied_peak_tflops": round(tf / (eff / 100), 1) if tf and eff else None,
        "of_measured_pct": round(100 * tf / measured, 2) if tf and measured else None,
        "of_spec_pct": round(100 * tf / spec, 2) if tf and spec else None,
    }
    out["plausible"] = (
        None if not tf else bool((eff or 0) <= 100 and (not measured or tf <= 1.1 * measured))
    )
    return out


#: ``perfguard analyze``'s note on work replayed from CUDA graphs (analysis/attribution.py)
REPLAYED = re.compile(r"(\d+) GPU activities \(([\d.]+) % of GPU time\) were replayed")
TIED = re.compile(r"(\d+) of them \(([\d.]+) % of the replayed GPU time\) were tied")


def graph_replay(notes: list[str], detail_csv: Path) -> dict[str, Any] | None:
    """How much GPU time was replayed from CUDA graphs, and the share of it attributed to
    named ops (tied to the op that recorded it) rather than ``graph_replay_<id>``."""
    for note in notes:
        m = REPLAYED.search(note)
        if not m:
            continue
        tied = TIED.search(note)
        untied = [
            r["Op Name"]
            for r in read_detail(detail_csv)
            if r["Op Name"].split("/")[-1].startswith("graph_replay_")
        ]
        return {
            "activities": int(m[1]),
            "replayed_pct_of_gpu": float(m[2]),
            "tied": int(tied[1]) if tied else 0,
            "named_pct_of_replayed": float(tied[2]) if tied else 0.0,
            "untied_ops": untied[:5],
            "note": note[:600],
        }
    return None


def round_cost(row: dict[str, Any], plain_ms: float | None) -> dict[str, Any]:
    """The profiled round's cost next to the timed rounds' (``phase_s``) and the plain
    step's (the probe): on the CPU one profiled round after unprofiled timed rounds; on a
    GPU every round is profiled, and the plain steps are the reference."""
    ph = row.get("phase_s") or {}
    rounds = len(row.get("rounds") or []) or 1
    iters = (row.get("samples") or 0) / rounds or None
    separate = "timing" in ph
    prof_rounds = 1 if separate else rounds
    out: dict[str, Any] = {
        "iterations": iters,
        "profiled_s": ph.get("profiled"),
        "profiled_rounds": prof_rounds,
        "timed_s": ph.get("timing"),
        "timed_rounds": rounds if separate else 0,
        "warmup_s": ph.get("warmup"),
        "analysis_s": ph.get("analysis"),
    }
    prof = ph.get("profiled")
    out["profiled_round_s"] = prof / prof_rounds if prof else None
    out["timed_round_s"] = ph["timing"] / rounds if separate else None
    out["plain_round_s"] = plain_ms * iters / 1e3 if plain_ms and iters else None
    for k in ("timed", "plain"):
        ref = out[f"{k}_round_s"]
        out[f"x_{k}"] = round(out["profiled_round_s"] / ref, 2) if ref and prof else None
    return out


def assumed_sigmas() -> dict[str, Any]:
    """The noise the verdict and the calibration assume for GPU time, read from the code."""
    from perfguard.compare.timing import PRIOR_RUN_SD

    out: dict[str, Any] = {"timing.PRIOR_RUN_SD": PRIOR_RUN_SD}
    cal = ROOT / "benchmarks" / "calibration.py"
    if cal.is_file():
        text = cal.read_text()
        for flag in ("gpu-sigma-session", "gpu-sigma-round"):
            m = re.search(rf'"--{flag}", type=float, default=([0-9.e-]+)', text)
            out[f"calibration --{flag}"] = float(m.group(1)) if m else None
    return out


def manifest_lines(folder: Path) -> list[str]:
    path = folder / "manifest.jsonl"
    return path.read_text().splitlines() if path.is_file() else []


def top_kernels(csv_path: Path, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` kernels with the most GPU time in a kernel report."""
    import csv

    if not csv_path.is_file():
        return []
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: -float(r.get("Total GPU Time (ns)") or 0))
    return [
        {
            "name": r.get("Kernel Name"),
            "short_name": r.get("Kernel Short Name"),
            "op": r.get("Op Name"),
            "gpu_ns": float(r.get("Total GPU Time (ns)") or 0),
            "calls": r.get("No. Calls"),
        }
        for r in rows[:n]
    ]


def kernel_word(name: str) -> str:
    """A plain piece of a kernel's name for ncu's regex: its longest identifier."""
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]{3,}", name or "")
    return max(words, key=len)[:80] if words else "gemm"


def keep_inductor_debug(debug: Path, dest: Path, limit: int = 2 * 1024 * 1024) -> list[str]:
    """Inductor's debug files worth keeping (output code, provenance, fx graphs, IR), up to
    ``limit`` bytes, smallest first."""
    if not debug.is_dir():
        return []
    wanted = (
        "output_code.py",
        "inductor_provenance_tracking_node_mappings.json",
        "fx_graph_readable.py",
        "fx_graph_transformed.py",
        "ir_post_fusion.txt",
        "ir_pre_fusion.txt",
    )
    files = sorted(
        (p for p in debug.rglob("*") if p.is_file() and p.name in wanted),
        key=lambda p: p.stat().st_size,
    )
    kept, used = [], 0
    for p in files:
        size = p.stat().st_size
        if used + size > limit:
            continue
        rel = p.relative_to(debug)
        target = dest / rel.parent.name / p.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, target)
        kept.append(str(target.relative_to(dest.parent)))
        used += size
    return kept


def pack_folder(folder: Path, target: Path, limit: int) -> dict[str, Any]:
    """``folder`` as a .tar.gz under ``limit`` bytes: files are left out (and named) until
    it fits, the A/A and change sessions' pytest captures first, then the largest."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())

    def spare(p: Path) -> tuple[bool, int]:
        rel = p.relative_to(folder).parts
        capture = len(rel) > 2 and rel[0] == "sessions" and rel[2] == "captures"
        return (capture and rel[1] != "save", p.stat().st_size)

    dropped: list[str] = []
    while True:
        tmp = target.with_name(f".{target.name}.tmp")
        with tarfile.open(tmp, "w:gz", compresslevel=3) as tar:  # rewritten every step
            for p in files:
                tar.add(p, arcname=str(p.relative_to(folder.parent)))
        size = tmp.stat().st_size
        if size <= limit or not files:
            tmp.replace(target)
            return {"bytes": size, "files": len(files), "left_out_too_big": dropped}
        biggest = max(files, key=spare)
        files.remove(biggest)
        dropped.append(f"{biggest.relative_to(folder)} ({biggest.stat().st_size} bytes)")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    if isinstance(v, list):
        return ", ".join(_fmt(x, digits) for x in v) or "-"
    return str(v)


def markdown(s: dict[str, Any]) -> str:
    """summary.md: the same content as summary.json, for people."""
    env = s.get("env") or {}
    t = env.get("torch") or {}
    lines = [
        f"# perfguard GPU acceptance run{' (dry, CPU)' if s['dry'] else ''}",
        "",
        f"Started {s['started']}, {s.get('elapsed_s')} s of a {s['deadline_s']:.0f} s "
        f"deadline. GPU {t.get('gpu', '-')}, torch {t.get('torch', '-')}, CUDA "
        f"{t.get('cuda', '-')}, cuDNN {t.get('cudnn', '-')}, Python {env.get('python')}, "
        f"git: {'yes' if (env.get('git') or {}).get('rc') == 0 else 'NO'}.",
        "",
        "## Steps",
        "",
        "| step | status | s | note / error |",
        "|---|---|---|---|",
    ]
    for st in s["steps"]:
        note = st["note"] or ""
        if st["error"]:
            note += " " + st["error"].strip().splitlines()[-1]
        lines.append(
            f"| {st['name']} | {st['status']} | {_fmt(st['wall_s'], 1)} | "
            f"{note.strip().replace('|', '/')[:300]} |"
        )
    deps = env.get("deps") or {}
    missing = [d for d, v in deps.items() if not v.get("imports")]
    if deps:
        lines += ["", f"Dependencies that do not import: {', '.join(missing) or 'none'}."]
    lines += [
        "",
        "## Sessions",
        "",
        "| session | rc | s | test | outcome | metric | median "
        "| delta % | interval % | timing | gates fired |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ses in s["sessions"]:
        for row in ses.get("tests") or [{}]:
            lines.append(
                f"| {ses['name']} | {ses['rc']} | {ses['wall_s']} | "
                f"{(row.get('nodeid') or '-').split('::')[-1]} | {row.get('outcome', '-')} | "
                f"{row.get('metric', '-')} | {_fmt(row.get('median_ns'), 0)} | "
                f"{_fmt(row.get('delta_pct'))} | {_fmt(row.get('ci_pct'))} | "
                f"{row.get('timing_outcome', '-')} | {_fmt(row.get('gates_fired'))} |"
            )
    if s["changes"]:
        lines += [
            "",
            "## Injected changes",
            "",
            "| change | test | expected | outcome | decided "
            "by | timing | delta % | gates fired | other tests |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        culprits = []
        for c in s["changes"]:
            others = ", ".join(f"{k.split('::')[-1]}: {v}" for k, v in c["others"].items())
            for nodeid, t in (c.get("tests") or {c["test"]: c}).items():
                lines.append(
                    f"| {c['change']} ({c['what']}) | {nodeid.split('::')[-1]} | "
                    f"{c['expect']} | {t['outcome']} | {t.get('decided_by') or '-'} | "
                    f"{t['timing_outcome']} | {_fmt(t['delta_pct'])} | "
                    f"{_fmt(t['gates_fired'])} | {others} |"
                )
                if t.get("culprit"):
                    site = f" (call site: `{t['call_site']}`)" if t.get("call_site") else ""
                    culprits.append(
                        f"- {c['change']}, {nodeid.split('::')[-1]}{site}: `{t['culprit']}`"
                    )
        if culprits:
            lines += ["", "First culprit line of each changed test's `summary.md`:", "", *culprits]
    noise = (s.get("noise") or {}).get("tests") or {}
    if noise:
        lines += [
            "",
            "## Between-session noise of unchanged code",
            "",
            "| test | metric | sessions | mean ns | sd/mean % | log sd % | successive-MAD "
            "sd % (the judge's) | within-session round sd % | assumed prior % |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for nodeid, n in noise.items():
            lines.append(
                f"| {nodeid.split('::')[-1]} | {n['metric']} | {n['sessions']} | "
                f"{_fmt(n['mean_ns'], 0)} | {_fmt(n['sd_over_mean_pct'])} | "
                f"{_fmt(n['log_sd_pct'])} | {_fmt(n['successive_mad_sd_pct'])} | "
                f"{_fmt(n['within_session_round_sd_pct'])} | {_fmt(n['assumed_prior_sd_pct'])} |"
            )
        lines += ["", f"Assumed: `{json.dumps(s['noise'].get('assumed'))}`."]
    if s["traces"]:
        lines += [
            "",
            "## Traces (fixtures.tar.gz)",
            "",
            "| trace | bytes | analyze | top kernel | its op |",
            "|---|---|---|---|---|",
        ]
        for tr in s["traces"]:
            a = tr.get("analyze") or {}
            k = (a.get("top_kernels") or [{}])[0]
            lines.append(
                f"| {tr['trace']} | {tr['bytes']} | rc {a.get('rc')} | "
                f"{(k.get('short_name') or '-')[:60]} | {(k.get('op') or '-')[-60:]} |"
            )
    lines += models_markdown(s)
    # a summary from before the fix holds the untried attempt's ncu arguments (a list)
    # after the one that read counters: only the attempts made are results
    for a in s.get("ncu") or []:
        if not isinstance(a, dict):
            continue
        lines += [
            "",
            f"ncu: rc {a.get('rc')}, {a.get('csv_rows')} CSV rows, counters read: "
            f"{a.get('counters_read')}",
        ]
    packed = (s.get("packed") or {}).get("files") or {}
    if packed:
        lines += [
            "",
            "Packed: "
            + ", ".join(
                f"{k} {v['bytes']} bytes ({v['files']} files"
                + (
                    f", left out: {'; '.join(v['left_out_too_big'])}"
                    if v["left_out_too_big"]
                    else ""
                )
                + ")"
                for k, v in packed.items()
            ),
        ]
    return "\n".join(lines) + "\n"


def models_markdown(s: dict[str, Any]) -> list[str]:
    """The per-model sections of summary.md (issue 44 item 2)."""
    found = s.get("models") or {}
    models = {
        k: found[k]
        for k in MODEL_TESTS
        if k in found and (found[k].get("save") or found[k].get("probe"))
    }
    if not models:
        return []
    peak = (s.get("probe") or {}).get("matmul") or {}
    lines = [
        "",
        "## Per model",
        "",
        f"Measured bf16 matmul ({peak.get('n')}^3): {peak.get('tflops')} TFLOP/s.",
        "",
        "| test | implementation | A/A outcomes | between-session sd % (judge's) | "
        "profiled round s | timed round s | plain round s | profiled / timed | "
        "profiled / plain | FLOPs per step, perfguard / FlopCounterMode | replayed "
        "GPU time named % |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for nodeid, m in models.items():
        p, c, n = m.get("probe") or {}, m.get("cost") or {}, m.get("noise") or {}
        f, g = m.get("flops") or {}, (m.get("analyze") or {}).get("graph_replay") or {}
        impl = p.get("source") or p.get("skipped") or ("error" if p.get("error") else "-")
        flops = (
            f"{_fmt(f.get('perfguard'), 0)} / {_fmt(f.get('flop_counter'), 0)} "
            f"({_fmt(f.get('ratio'), 3)})"
            if f
            else "-"
        )
        lines.append(
            f"| {nodeid.split('::')[-1]} | {impl} | {_fmt(m.get('aa'))} | "
            f"{_fmt(n.get('sd_over_mean_pct'))} ({_fmt(n.get('successive_mad_sd_pct'))}) | "
            f"{_fmt(c.get('profiled_round_s'), 3)} | {_fmt(c.get('timed_round_s'), 3)} | "
            f"{_fmt(c.get('plain_round_s'), 3)} | {_fmt(c.get('x_timed'))} | "
            f"{_fmt(c.get('x_plain'))} | {flops} | {_fmt(g.get('named_pct_of_replayed'), 1)} |"
        )
    for nodeid, m in models.items():
        gemms = m.get("gemms") or []
        if not gemms:
            continue
        lines += [
            "",
            f"Top GEMMs of {nodeid.split('::')[-1]} (perfguard analyze):",
            "",
            "| op | dtype | calls | TC % | TFLOP/s | FLOP eff % | implied peak | % of "
            "measured | % of spec | plausible |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in gemms:
            lines.append(
                f"| {r['op'].split('/')[-1]} ({r['direction']}) | {r['dtype']} | "
                f"{_fmt(r['calls'], 0)} | "
                f"{_fmt(r['tc_pct'], 1)} | {_fmt(r['tflops'])} | {_fmt(r['eff_pct'])} | "
                f"{_fmt(r['implied_peak_tflops'], 1)} | {_fmt(r['of_measured_pct'])} | "
                f"{_fmt(r['of_spec_pct'])} | {_fmt(r['plausible'])} |"
            )
        f = m.get("flops") or {}
        if f.get("per_op"):
            by_op = "; ".join(
                f"{op} {_fmt(v['perfguard'], 0)} / {v['flop_counter']} ({_fmt(v['ratio'], 3)})"
                for op, v in f["per_op"].items()
            )
            rest = "; ".join(f"{op} {v:.0f}" for op, v in (f.get("unmatched") or {}).items())
            lines += [
                "",
                f"FLOPs per step by op, perfguard / FlopCounterMode: {by_op}; "
                f"perfguard's matrix FLOPs on ops it does not count: {rest or '-'}",
            ]
    for nodeid, m in models.items():
        g = (m.get("analyze") or {}).get("graph_replay")
        if g:
            lines += ["", f"CUDA graphs, {nodeid.split('::')[-1]}: {g['note']}"]
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for the packed results (at most 8 files come back)",
    )
    p.add_argument("--work", type=Path, help="working folder (default: a new temp folder)")
    p.add_argument(
        "--suite",
        choices=("models", "examples"),
        default="models",
        help="models: real model code (issue 44, the default); examples: "
        "perfguard's examples, traces, compile and ncu (issue 32)",
    )
    p.add_argument(
        "--dry",
        action="store_true",
        help="run every step on the CPU with tiny sizes (tests/test_gpu_acceptance)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        help="seconds for the whole run (default: models 440, examples 450)",
    )
    p.add_argument(
        "--aa", type=int, help="A/A sessions after the save (default: models 2, examples 5; dry 1)"
    )
    p.add_argument(
        "--changes",
        help=f"comma list of {','.join(MODEL_CHANGES)} (models) or "
        f"{','.join(CHANGES)} (examples) (default all; dry: those that change "
        "something on the CPU)",
    )
    p.add_argument("--only", help="comma list of steps (or kinds: aa, change) to run")
    p.add_argument("--rounds", type=int, help="--perfguard-rounds (default 5, dry 3)")
    p.add_argument("--trace-iters", type=int, help="profiled iterations per trace (10, dry 3)")
    p.add_argument("--session-timeout", type=float, default=150)
    p.add_argument("--trace-timeout", type=float, default=90)
    p.add_argument("--graph-timeout", type=float, default=60)
    p.add_argument("--compile-timeout", type=float, default=150)
    p.add_argument("--analyze-timeout", type=float, default=60)
    p.add_argument("--probe-timeout", type=float, default=120)
    p.add_argument("--ncu-timeout", type=float, default=60)
    p.add_argument(
        "--pretend-no-git",
        action="store_true",
        help="act as if git were missing (tests the no-git path)",
    )
    a = p.parse_args(argv)
    models = a.suite == "models"
    a.deadline = a.deadline or (600.0 if a.dry else 440.0 if models else 450.0)
    a.aa = a.aa if a.aa is not None else (1 if a.dry else 2 if models else 5)
    a.rounds = a.rounds or (3 if a.dry else 5)
    a.trace_iters = a.trace_iters or (3 if a.dry else 10)
    table = MODEL_CHANGES if models else CHANGES
    names = [c.strip() for c in (a.changes or "").split(",") if c.strip()]
    if not names:
        names = [c.name for c in table.values() if c.on_cpu or not a.dry]
    bad = [n for n in names if n not in table]
    if bad:
        p.error(
            f"unknown change(s) {', '.join(bad)} for --suite {a.suite}; choose from "
            f"{', '.join(table)}"
        )
    a.changes = names
    a.only = {s.strip() for s in (a.only or "").split(",") if s.strip()} or None
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Acceptance(args)

    def on_term(signum: int, frame: Any) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    try:
        run.main()
    except (Terminated, KeyboardInterrupt):
        run.kill_child()
        run.say("!! stopped by a signal: packing what there is")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        run.summary["finished"] = True
        run.checkpoint()
        run.say(f"done in {run.elapsed():.1f} s: {run.out}")
        run.log_file.close()
    failed = [s.name for s in run.steps if s.status == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
