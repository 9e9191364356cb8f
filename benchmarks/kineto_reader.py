"""Kineto reader benchmark: perfguard against Holistic Trace Analysis (HTA), side by side.

Builds Kineto captures of N kernels by replicating the A100 2-rank NCCL
training trace (``large_capture.build_kineto``: ``ts``, correlation and
flow ids shifted per copy) and times, each in a fresh child process with
its peak RSS (``ru_maxrss`` from ``os.wait4``) and the peak of its process
tree's summed RSS (sampled every 50 ms: perfguard forks a second reader for
plain files over 256 MB; the memory target is checked on the tree):

* ``perfguard``: ``python -m perfguard analyze --reports kernel --formats csv``
  (read the trace, attribute, write the kernel report);
* ``hta``: HTA 0.5.0 ``TraceAnalysis(trace_dir).get_gpu_kernel_breakdown()``
  (parse + kernel breakdown), run by the Python of HTA's own virtualenv
  (``--hta-python``; ``--make-hta-venv DIR`` makes one with
  ``pip install holistictraceanalysis==0.5.0``);
* ``json.load``: the bare stdlib parse of the file, the floor of any reader
  that builds a dict per event;
* ``decoders`` (``--decoders``): the candidate decoders for the reader on
  the same file, parse only: ``json``, ``orjson`` (dicts) and ``msgspec``
  typed structs (what perfguard uses).

HTA is only run up to ``--hta-max`` kernels (default 200,000): at 1M
kernels it did not finish in 600 s in the issue's measurement.

Usage::

    python benchmarks/kineto_reader.py --kernels 50000 200000 --hta-python /tmp/hta/bin/python
    nice python benchmarks/kineto_reader.py --kernels 1000000 --skip-hta --skip-json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from large_capture import (  # noqa: E402
    FIXTURES,
    KINETO_FIXTURE,
    LAST_TREE_KB,
    _mb,
    _run,
    _table,
    build_kineto,
)

HTA_VERSION = "0.5.0"
#: the issue's targets: kernels -> (wall s, peak bytes)
TARGETS = {50_000: (2.5, 330e6), 200_000: (8.0, 1.2e9), 1_000_000: (40.0, 4e9)}

_HTA = r"""
import sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
k = a.get_gpu_kernel_breakdown(visualize=False)
print(len(k[1]))
"""
_JSON = r"""
import json, sys
with open(sys.argv[1], "rb") as fh:
    d = json.load(fh)
print(len(d["traceEvents"]))
"""
_DECODE = r"""
import sys, time
path, how = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if how == "json":
    import json; n = len(json.loads(open(path, "rb").read())["traceEvents"])
elif how == "orjson":
    import orjson; n = len(orjson.loads(open(path, "rb").read())["traceEvents"])
else:
    from perfguard.trace.kineto_stream import stream_events
    from pathlib import Path
    count = [0]
    stream_events(Path(path), lambda evs: count.__setitem__(0, count[0] + len(evs)))
    n = count[0]
print(n, time.perf_counter() - t)
"""


def make_hta_venv(dest: Path) -> Path:
    """A virtualenv at ``dest`` with HTA installed; returns its python."""
    py = dest / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", f"holistictraceanalysis=={HTA_VERSION}"],
            check=True,
        )
    return py


def measure(name: str, cmd: list[str], mem_limit_gb: float) -> dict[str, Any]:
    rc, wall, rss, cpu, text, error = _run(cmd, mem_limit_gb)
    tree = max(LAST_TREE_KB[0], rss)  # the sampler may miss a short peak
    print(
        f"  {name}: {wall:.2f} s, {_mb(rss)}, process tree {_mb(tree)}"
        + (f" FAILED: {error}" if rc else "")
    )
    return {
        "tool": name,
        "rc": rc,
        "wall_s": wall,
        "peak_kb": rss,
        "tree_kb": tree,
        "cpu_s": cpu,
        "out": text,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", type=int, nargs="+", default=[50_000, 200_000])
    p.add_argument("--hta-python", type=Path, help="python of a virtualenv with HTA installed")
    p.add_argument("--make-hta-venv", type=Path, help="make (or reuse) HTA's virtualenv here")
    p.add_argument("--hta-max", type=int, default=200_000, help="largest capture HTA reads")
    p.add_argument("--skip-hta", action="store_true")
    p.add_argument("--skip-json", action="store_true", help="no bare json.load run")
    p.add_argument("--decoders", action="store_true", help="also time the candidate decoders")
    p.add_argument("--keep", type=Path, help="directory to keep (and reuse) the captures in")
    p.add_argument("--mem-limit-gb", type=float, default=20.0)
    args = p.parse_args(argv)

    hta_py = args.hta_python
    if args.make_hta_venv and not args.skip_hta:
        hta_py = make_hta_venv(args.make_hta_venv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="pg_kineto_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    rows = [
        ["kernels", "events", "file", "tool", "wall s", "CPU s", "peak RSS", "tree RSS", "target"]
    ]
    failed = False
    for kernels in args.kernels:
        cap_dir = work / f"k{kernels}"
        cap_dir.mkdir(exist_ok=True)
        dest = cap_dir / "rank-0.pt.trace.json"
        info_file = cap_dir / "built.json"
        if dest.exists() and info_file.exists():
            built = json.loads(info_file.read_text())
        else:
            built = build_kineto(FIXTURES / KINETO_FIXTURE, dest, kernels)
            built["path"] = str(built["path"])
            info_file.write_text(json.dumps(built))
        print(f"{kernels:,} kernels: {built['events']:,} events, {built['bytes'] / 1e6:,.0f} MB")
        results = [
            measure(
                "perfguard",
                [
                    sys.executable,
                    "-m",
                    "perfguard",
                    "analyze",
                    "--database",
                    str(dest),
                    "--reports",
                    "kernel",
                    "--formats",
                    "csv",
                    "--output-path",
                    str(work / "reports"),
                    "--force",
                ],
                args.mem_limit_gb,
            )
        ]
        if hta_py and not args.skip_hta and kernels <= args.hta_max:
            results.append(measure("HTA", [str(hta_py), "-c", _HTA, str(cap_dir)], 40))
        if not args.skip_json:
            results.append(measure("json.load", [sys.executable, "-c", _JSON, str(dest)], 40))
        if args.decoders:
            for how in ("json", "orjson", "msgspec"):
                r = measure(f"decode:{how}", [sys.executable, "-c", _DECODE, str(dest), how], 40)
                if r["rc"] == 0:
                    r["decode_s"] = float(r["out"].split()[1])
                    print(f"    parse only: {r['decode_s']:.2f} s")
                results.append(r)
        for r in results:
            target = ""
            if r["tool"] == "perfguard" and kernels in TARGETS:
                wall_t, rss_t = TARGETS[kernels]
                # memory: the whole process tree (the reader may fork a second process)
                ok = r["rc"] == 0 and r["wall_s"] <= wall_t and r["tree_kb"] * 1024 <= rss_t
                failed |= not ok
                target = f"<= {wall_t:g} s, <= {rss_t / 1e6:,.0f} MB: {'met' if ok else 'MISSED'}"
            rows.append(
                [
                    f"{kernels:,}",
                    f"{built['events']:,}",
                    f"{built['bytes'] / 1e6:,.0f} MB",
                    r["tool"],
                    f"{r['wall_s']:.2f}" + ("" if r["rc"] == 0 else " (failed)"),
                    f"{r['cpu_s']:.2f}",
                    _mb(r["peak_kb"]),
                    _mb(r["tree_kb"]),
                    target,
                ]
            )
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print(_table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
