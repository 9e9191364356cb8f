"""Size and render time of the session HTML report for a large run.

A synthetic ``results.json`` with ``--tests`` tests (default 20) of ``--ops``
ops each (default 500), ``--samples`` per-iteration samples per side (30),
``--history`` stored medians per test (20), a few kernel changes and
findings per test, and op/kernel names as long and as full of ``<``, ``>``
and ``&`` as C++ template kernels are. Verdicts are mixed (regressed,
improved, unchanged, new, no-baseline). The file follows the schema the
pytest plugin writes; the numbers are random but consistent (medians are
the samples' medians).

Measured in this process after a warm-up render (imports and font cache
excluded; the cold import time is printed apart): the wall time and the
process CPU time of ``write_session_html`` and ``write_markdown``, best of
``--repeat``. CPU time is not inflated when other processes compete for the
cores, wall time is. Targets: report under 2 MB, render under 2 s.

Usage::

    python benchmarks/report_size.py
    python benchmarks/report_size.py --tests 20 --ops 500 --repeat 5 --keep /tmp/report.html
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

OUTCOMES = ("regressed", "improved", "unchanged", "unchanged", "unchanged", "new", "no-baseline")


def synthetic_results(
    tests: int, ops: int, samples: int, history: int, seed: int = 0
) -> dict[str, Any]:
    """A results.json dict of the given size (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out_tests = []
    for t in range(tests):
        outcome = OUTCOMES[t % len(OUTCOMES)]
        base_ns = float(rng.uniform(2e6, 80e6))
        shift = {"regressed": 1.12, "improved": 0.9}.get(outcome, 1.0)
        cur = rng.normal(base_ns * shift, base_ns * 0.01, samples).round()
        has_base = outcome not in ("new", "no-baseline")
        base = rng.normal(base_ns, base_ns * 0.01, samples).round() if has_base else np.empty(0)
        mc = float(np.median(cur))
        mb = float(np.median(base)) if has_base else None
        share = rng.dirichlet(np.ones(ops)) * base_ns
        op_rows = []
        for i in range(ops):  # builds test data, not part of what is measured
            b = float(share[i])
            c = b * (shift if i < 3 else float(rng.normal(1.0, 0.01)))
            status = outcome if i < 3 and outcome in ("regressed", "improved") else "unchanged"
            op_rows.append(
                {
                    "op_id": f"{t:02x}{i:014x}",
                    "op_name": f"model/layer{i // 10}/block{i % 10}/aten::linear<float, &cfg>/"
                    f"aten::addmm_{i}",
                    "direction": "fprop" if i % 2 else "bprop",
                    "status": status,
                    "baseline_ns": b if has_base else None,
                    "current_ns": c,
                    "delta_pct": 100 * (c / b - 1) if has_base else None,
                    "ci_low_pct": 100 * (c / b - 1) - 0.8 if has_base else None,
                    "ci_high_pct": 100 * (c / b - 1) + 0.8 if has_base else None,
                    "p_value": float(rng.uniform(0, 1)) if status == "unchanged" else 1e-5,
                    "calls_baseline": 4.0,
                    "calls_current": 4.0,
                    "tc_util_baseline": float(rng.uniform(0, 100)) if i % 3 == 0 else None,
                    "tc_util_current": float(rng.uniform(0, 100)) if i % 3 == 0 else None,
                    "flop_eff_baseline": float(rng.uniform(0, 80)) if i % 4 == 0 else None,
                    "flop_eff_current": float(rng.uniform(0, 80)) if i % 4 == 0 else None,
                }
            )
        delta = 100 * (mc / mb - 1) if mb else None
        out_tests.append(
            {
                "nodeid": f"tests/perf/test_model.py::test_step[config-{t}]",
                "outcome": outcome,
                "metric": "gpu_time",
                "n_current": samples,
                "n_baseline": samples if has_base else 0,
                "median_current_ns": mc,
                "median_baseline_ns": mb,
                "delta_pct": delta,
                "ci_low_pct": delta - 1.0 if delta is not None else None,
                "ci_high_pct": delta + 1.0 if delta is not None else None,
                "p_value": 1e-6 if outcome in ("regressed", "improved") else 0.4,
                "tolerance_pct": 5.0,
                "alpha": 0.01,
                "message": f"gpu_time median {outcome}",
                "ops": op_rows,
                "kernel_changes": [
                    {
                        "kind": "tc_lost",
                        "op_name": op_rows[0]["op_name"],
                        "kernel_name": "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128"
                        "_32x3_nn_align4>(Params<float, &x>)",
                        "baseline": True,
                        "current": False,
                    }
                ],
                "samples_current": cur.tolist(),
                "samples_baseline": base.tolist(),
                "findings": [
                    {
                        "check": "amp_not_used",
                        "severity": "warning",
                        "problem": "fp32 GEMMs take 40 % of GPU time",
                        "evidence": "aten::addmm <float> & friends",
                        "recommendation": "Use torch.autocast(dtype=torch.bfloat16)",
                    }
                ],
                "history": [
                    {
                        "commit": f"{h:07x}{t:033x}",
                        "time": f"2026-01-{h + 1:02d}T00:00:00Z",
                        "median_ns": base_ns * float(rng.normal(1.0, 0.01)),
                    }
                    for h in range(history)
                ],
                "backend": "nsys",
                "capture": f".perfguard/captures/test_step-{t}.sqlite",
            }
        )
    counts: dict[str, int] = {}
    for t in out_tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    return {
        "schema": 1,
        "perfguard_version": "0.1.0",
        "run": {
            "commit": "1" * 40,
            "branch": "feature",
            "dirty": False,
            "time": "2026-01-31T00:00:00Z",
            "fingerprint": {
                "gpu_name": "NVIDIA H100 80GB HBM3",
                "gpu_count": 1,
                "driver": "550.54",
                "cuda": "12.4",
                "torch": "2.13.0",
                "backend": "nsys",
                "host": "ci",
                "python": "3.11",
            },
        },
        "baseline": {"ref": "origin/main", "commit": "2" * 40, "run_id": "7"},
        "settings": {
            "tolerance": 0.05,
            "alpha": 0.01,
            "fail_on": "regression",
            "backend": "nsys",
        },
        "counts": counts,
        "tests": out_tests,
    }


def _cold_import_s() -> float:
    code = (
        "import time; t = time.perf_counter(); "
        "import perfguard.report.html, perfguard.report.figures, matplotlib.figure; "
        "print(time.perf_counter() - t)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=20)
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--history", type=int, default=20)
    parser.add_argument("--max-ops", type=int, default=50, help="ops listed per test")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="FILE", help="also write the report here")
    args = parser.parse_args(argv)

    from perfguard.report.html import write_session_html
    from perfguard.report.markdown import write_markdown

    results = synthetic_results(args.tests, args.ops, args.samples, args.history)
    with tempfile.TemporaryDirectory() as tmp:
        html, md = Path(tmp) / "report.html", Path(tmp) / "summary.md"
        write_session_html(results, html, max_ops=args.max_ops)  # warm-up: fonts, templates
        runs = []
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            write_session_html(results, html, max_ops=args.max_ops)
            w1, c1 = time.perf_counter(), time.process_time()
            write_markdown(results, md, step_summary=False)
            w2, c2 = time.perf_counter(), time.process_time()
            runs.append((w1 - w0, c1 - c0, w2 - w1, c2 - c1))
        size, md_size = html.stat().st_size, md.stat().st_size
        if args.keep:
            Path(args.keep).write_bytes(html.read_bytes())
    best = [min(r[i] for r in runs) for i in range(4)]
    print(
        f"results: {args.tests} tests x {args.ops} ops, {args.samples} samples/side, "
        f"{args.history} history points; {args.max_ops} ops listed per test"
    )
    print(
        f"report.html: {size / 1e6:.3f} MB ({size:,} bytes)   target < 2 MB: "
        f"{'ok' if size < 2e6 else 'MISSED'}"
    )
    print(
        f"render (best of {args.repeat}): wall {best[0]:.3f} s, cpu {best[1]:.3f} s   "
        f"target < 2 s: {'ok' if best[0] < 2 else 'MISSED'}"
    )
    print(f"summary.md: {md_size:,} bytes, wall {best[2] * 1e3:.1f} ms, cpu {best[3] * 1e3:.1f} ms")
    print(f"cold import of the report modules: {_cold_import_s():.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
