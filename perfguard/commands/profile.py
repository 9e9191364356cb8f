"""``perfguard profile [options] -- COMMAND ...``: capture a command, then analyse it.

The capture lands in ``--output-path`` next to the reports, so changing the
key node or iteration range later is ``perfguard analyze --database
<capture>``, without profiling again (as DLProf's ``--database`` was).
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from perfguard.commands.analyze import add_analyze_options

    p = sub.add_parser(
        "profile",
        help="profile a command (nsys, the PyTorch profiler, or CPU-only) and analyse it",
        description="Run COMMAND under a profiler, write the capture to --output-path, then "
        "analyse it as `perfguard analyze` does. Put `--` before the command.",
    )
    p.add_argument("--backend", choices=("auto", "nsys", "torch", "tf", "jax"), default="auto",
                   help="auto: nsys when installed and a GPU is present, else the PyTorch "
                        "profiler (CUDA when available, else CPU); tf/jax: the TensorFlow "
                        "or JAX profiler (an .xplane.pb)")  # fmt: skip
    p.add_argument("--name", default="capture", help="capture file name (default: capture)")
    p.add_argument(
        "--nsys", metavar="PATH", help="nsys executable (default: $PERFGUARD_NSYS, PATH)"
    )
    p.add_argument("--delay", "-y", type=float, metavar="S", help="nsys: start after S seconds")
    p.add_argument("--duration", type=float, metavar="S", help="nsys: stop after S seconds")
    p.add_argument("--capture-range", "--capture_range", dest="capture_range",
                   metavar="cudaProfilerApi|nvtx:NAME",
                   help="nsys: capture only between cudaProfilerStart/Stop or inside an "
                        "NVTX range")  # fmt: skip
    p.add_argument("--export-mode", choices=("inline", "separate"), default="inline",
                   help="nsys: --export=sqlite (inline) or a separate `nsys export`")  # fmt: skip
    p.add_argument("--timeout", type=float, metavar="S",
                   help="stop the command (its whole process group) after S seconds")  # fmt: skip
    add_analyze_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the program to profile and its arguments")  # fmt: skip
    p.set_defaults(func=run, skip_teardown=True)  # see perfguard.cli._exit_now


def run(args: argparse.Namespace) -> int:
    from perfguard.capture import profile_command
    from perfguard.commands.analyze import analyze_and_report
    from perfguard.errors import CaptureError
    from perfguard.report.writer import check_output

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CaptureError("no command to profile: put it after `--`, e.g. "
                           "perfguard profile -- python train.py")  # fmt: skip
    check_output(args.output_path, args.base_name, args.reports, args.formats, args.force)
    result = profile_command(
        command,
        backend=args.backend,
        output_dir=args.output_path,
        name=args.name,
        delay=args.delay,
        duration=args.duration,
        capture_range=args.capture_range,
        nsys=args.nsys,
        timeout=args.timeout,
        export_mode=args.export_mode,
    )
    print(f"capture: {result.path} ({result.backend}: {result.why})")
    if result.returncode != 0:
        print(f"note: the command exited {result.returncode}; analysing what was captured")
    args.database = str(result.path)
    analyze_and_report(args)
    return 0 if result.returncode == 0 else 1
