"""Scale of the PyProf/DLProf marker step and of the Perfetto export.

Builds a PyProf capture (``tests/pyprof_capture.py``: the markers exactly as
``pyprof.init()`` writes them around ``emit_nvtx`` ranges, on a real export's
schema), replicates it inside SQLite to ``--kernels`` kernels with
``large_capture.build_nsys`` (copies shifted in time and correlation id),
then times in one process: ``load_trace`` (the marker parsing and folding
runs inside it), ``analyze`` and ``write_perfetto`` (gzip), and the same load with
the marker step switched off, so the step's own cost is the difference.

Usage::

    nice -n 10 python benchmarks/pyprof_perfetto.py --kernels 1000000
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "benchmarks")]

import large_capture  # noqa: E402
import pyprof_capture  # noqa: E402
from nsys_builder import TEMPLATE  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    args = parser.parse_args()

    import perfguard
    from perfguard.report.perfetto import write_perfetto
    from perfguard.trace import nsys as nsys_reader

    with tempfile.TemporaryDirectory() as tmp:
        small = pyprof_capture.build(large_capture.FIXTURES / TEMPLATE, Path(tmp) / "small.sqlite")
        t = time.perf_counter()
        big = large_capture.build_nsys(small, Path(tmp) / "big.sqlite", args.kernels, False)
        built = time.perf_counter() - t
        print(f"built {big['path'].name}: {big['copies']} copies in {built:.1f} s")

        t = time.perf_counter()
        trace = perfguard.load_trace(big["path"])
        load = time.perf_counter() - t
        real = nsys_reader.apply_markers
        nsys_reader.apply_markers = lambda ranges: ranges  # the same load without the step
        try:
            t = time.perf_counter()
            raw = perfguard.load_trace(big["path"])
            load_raw = time.perf_counter() - t
        finally:
            nsys_reader.apply_markers = real
        print(
            f"ranges: {len(raw.ranges):,} raw -> {len(trace.ranges):,} after folding; "
            f"kernels {len(trace.kernels):,}"
        )
        del raw
        t = time.perf_counter()
        result = perfguard.analyze(trace)
        analyse = time.perf_counter() - t
        t = time.perf_counter()
        out = write_perfetto(result, Path(tmp) / "trace.json.gz")
        render = time.perf_counter() - t
        size = out.stat().st_size
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"load_trace {load:.2f} s (without the marker step {load_raw:.2f} s: "
        f"step {load - load_raw:.2f} s)"
    )
    print(f"analyze {analyse:.2f} s; write_perfetto (.json.gz) {render:.2f} s, {size / 1e6:.0f} MB")
    print(f"peak RSS {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
