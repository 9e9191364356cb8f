"""Timing change points: perfguard's detector beside the ones performance teams use.

    python benchmarks/change_points.py [--tcpd DIR] [--spa-python PY] [--only SUITE ...]
    python benchmarks/change_points.py --calibrate

Three suites, every detector on the same series, one at a time, in one run:

* **Otava**: the generated suite of ``otava-test-data`` (Apache-2.0, on
  PyPI): ``CombinationGenerator(seed=42).generate_all_test_cases()``, 110
  series of 50 and 500 points, its 134 change points (outliers are not
  change points), matched within 5 points. Also: the share of its
  regression-and-fix series with both ends found.
* **CI kit** (:func:`ci_kit`, ours, seeded): 210 series of 30-120 run levels
  in CI shapes (steps, a regression and its fix, a drift, a change of spread
  alone, rare slow runs, two-valued banding, constant), log-normal noise of
  CV 1-5 %, matched within 1 run; a drift is one change anywhere on its ramp.
* **TCPD**: the univariate series of van den Burg & Williams's Turing Change
  Point Dataset (``--tcpd``: a checkout of its repository; its
  ``datasets/*/<name>.json`` and ``annotations.json``), the 5 annotator-
  training ``quality_control_*`` series left out, scored as TCPDBench scores
  its default experiment: F1 with margin 5 against all annotators combined
  (precision against the union of their points, recall the mean of each
  annotator's, the start of the series counted as a change point by all),
  averaged over the series. A missing value takes the previous one's place.

Detectors: perfguard's (:func:`perfguard.compare.changepoint.detect`),
Apache Otava (``otava.analysis.compute_change_points``, its defaults:
window 50, p 0.001), MongoDB's e-divisive
(``signal_processing_algorithms`` ``e_divisive``, p 0.05, 100 permutations;
it pins numpy < 2, so it runs in ``--spa-python``'s interpreter, a worker
fed over a pipe, its time measured there) and ruptures ``Binseg`` (l2 cost,
the BIC-style penalty of its documentation, ``log(n) * sigma^2``, sigma from
the median absolute successive difference). A detector that is not
installed is left out with a line saying so. The last table is the time per
200-point series (CI-kit shapes, 200 runs long).

Each suite is also split in two by series (a fixed random half, :data:`HALF_SEED`):
perfguard's bars are chosen on the first ("tune") and F1 is printed for each half
beside the whole, so what was not fitted shows. ``--calibrate`` prints the largest z
that perfguard's level and spread searches find in pure normal noise, by length: the
bars' false-alarm rates, and the line the spread bar is taken from.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from perfguard.compare.changepoint import detect  # noqa: E402

Truth = list[tuple[int, int]]  # each change: the interval of indices that match it
#: (label, values, truth, the indices of a regression and its fix when the series has one)
Series = tuple[str, np.ndarray, Truth, list[int]]


# ------------------------------------------------------------------ suites


def otava_suite() -> list[Series]:
    from otava_test_data.generators.combiner import CombinationGenerator

    out = []
    for ts in CombinationGenerator(seed=42).generate_all_test_cases():
        truth = [(cp.index, cp.index) for cp in ts.change_points if cp.change_type != "outlier"]
        fix = [cp.index for cp in ts.change_points if cp.change_type.startswith("regression")]
        out.append((ts.generator_name, np.asarray(ts.data, dtype=np.float64), truth, fix))
    return out


def _ci_series(rng: np.random.Generator, shape: str, n: int) -> tuple[np.ndarray, Truth]:
    cv = rng.uniform(0.01, 0.05)
    level = np.full(n, 10.0)
    truth: Truth = []

    def size() -> float:
        return rng.choice([-1, 1]) * rng.uniform(0.02, 0.15)

    if shape == "steps":
        k = int(rng.integers(1, 4))
        cuts = np.sort(rng.choice(np.arange(8, n - 8), size=k, replace=False))
        while len(cuts) > 1 and np.diff(cuts).min() < 6:
            cuts = np.sort(rng.choice(np.arange(8, n - 8), size=k, replace=False))
        for c in cuts:
            level[c:] *= 1 + size()
            truth.append((int(c), int(c)))
    elif shape == "regression_fix":
        start = int(rng.integers(8, n - 16))
        dur = int(rng.integers(3, 11))
        level[start : start + dur] *= 1 + abs(size())
        truth += [(start, start), (start + dur, start + dur)]
    elif shape == "drift":
        start = int(rng.integers(8, n // 2))
        ramp = int(rng.integers(10, 31))
        stop = min(n, start + ramp)
        level[start:stop] *= 1 + size() * np.linspace(0, 1, stop - start)
        level[stop:] = level[stop - 1]
        truth.append((start, stop))
    elif shape == "variance":
        c = int(rng.integers(10, n - 10))
        noise = rng.standard_normal(n) * cv
        noise[c:] *= rng.uniform(3, 5)
        return level * np.exp(noise), [(c, c)]
    elif shape == "banding":
        level *= 1 + rng.uniform(0.03, 0.08) * (rng.random(n) < rng.uniform(0.2, 0.5))
    values = level * np.exp(rng.standard_normal(n) * cv)
    if shape in ("outliers", "steps", "regression_fix", "banding"):
        slow = rng.random(n) < (0.06 if shape == "outliers" else 0.02)
        values[slow] *= 1 + rng.uniform(0.2, 0.6, slow.sum())  # a busy neighbour
    if shape == "constant":
        values = np.round(level * (1 + rng.uniform(-0.002, 0.002)), 3)  # a counter-like level
    return values, truth


CI_SHAPES = ("steps", "regression_fix", "drift", "variance", "outliers", "banding", "constant")


def ci_kit(n_per_shape: int = 30, seed: int = 20240601, length: int | None = None) -> list[Series]:
    rng = np.random.default_rng(seed)
    out = []
    for shape in CI_SHAPES:
        for i in range(n_per_shape):
            n = length or int(rng.integers(30, 121))
            values, truth = _ci_series(rng, shape, n)
            fix = [lo for lo, _ in truth] if shape == "regression_fix" else []
            out.append((f"{shape}-{i}", values, truth, fix))
    return out


def tcpd_suite(root: Path) -> list[tuple[str, np.ndarray, dict[str, list[int]]]]:
    annotations = json.loads((root / "annotations.json").read_text())
    out = []
    for path in sorted(root.glob("datasets/*/*.json")):
        name = path.stem
        if name not in annotations or name.startswith("quality_control"):
            continue
        doc = json.loads(path.read_text())
        if doc["n_dim"] != 1:
            continue
        raw = [np.nan if v is None else float(v) for v in doc["series"][0]["raw"]]
        x = np.asarray(raw, dtype=np.float64)
        for i in np.flatnonzero(np.isnan(x)):
            x[i] = x[i - 1] if i else np.nanmedian(x)
        out.append((name, x, annotations[name]))
    return out


# ------------------------------------------------------------------ scoring


def match(truth: Truth, found: list[int], margin: int) -> int:
    """True positives: each change matched to at most one detection within ``margin`` of
    its interval, nearest first."""
    free = sorted(found)
    tp = 0
    for lo, hi in sorted(truth):
        dist = [(max(lo - f, f - hi, 0), f) for f in free if lo - margin <= f <= hi + margin]
        if dist:
            free.remove(min(dist)[1])
            tp += 1
    return tp


def prf(tp: int, n_found: int, n_true: int) -> tuple[float, float, float]:
    p = tp / n_found if n_found else 1.0
    r = tp / n_true if n_true else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def tcpd_f1(annotations: dict[str, list[int]], found: list[int], margin: int = 5) -> float:
    """TCPDBench's F1 (van den Burg & Williams 2020, section 4.2): 0 counts as a change
    point for every annotator and the detector; precision against the union of the
    annotators' points, recall the mean of the annotators' recalls."""
    sets = [set(v) | {0} for v in annotations.values()]
    x = set(found) | {0}
    union = set().union(*sets)

    def tp(t: set[int]) -> int:
        return match([(i, i) for i in t], sorted(x), margin)

    p = tp(union) / len(x)
    r = sum(tp(t) / len(t) for t in sets) / len(sets)
    return 2 * p * r / (p + r) if p + r else 0.0


# ------------------------------------------------------------------ detectors


def perfguard(x: np.ndarray) -> list[int]:
    return [s.index for s in detect(x)]


def otava(x: np.ndarray) -> list[int]:
    from otava.analysis import compute_change_points

    return [cp.index for cp in compute_change_points(x.tolist())[0]]


def ruptures_binseg(x: np.ndarray) -> list[int]:
    import ruptures as rpt

    sigma = 1.4826 * np.median(np.abs(np.diff(x) - np.median(np.diff(x)))) / math.sqrt(2)
    pen = math.log(len(x)) * max(sigma, 1e-12) ** 2
    return [b for b in rpt.Binseg(model="l2", min_size=2).fit(x).predict(pen=pen) if b < len(x)]


def spa_e_divisive(x: np.ndarray) -> list[int]:
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    return sorted(int(i) for i in e_divisive(x, pvalue=0.05, permutations=100))


class Worker:
    """A detector run in another interpreter: series in on stdin, (indices, seconds) out."""

    def __init__(self, python: str, name: str) -> None:
        self.proc = subprocess.Popen(
            [python, __file__, "--worker", name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.last_seconds = self.last_cpu = 0.0

    def __call__(self, x: np.ndarray) -> list[int]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(x.tolist()) + "\n")
        found, self.last_seconds, self.last_cpu = json.loads(self.proc.stdout.readline())
        return found


def worker(name: str) -> int:
    fn = {"spa": spa_e_divisive}[name]
    for line in sys.stdin:
        x = np.asarray(json.loads(line), dtype=np.float64)
        t, c = time.perf_counter(), time.thread_time()
        found = fn(x)
        print(json.dumps([found, time.perf_counter() - t, time.thread_time() - c]), flush=True)
    return 0


def detectors(spa_python: str | None) -> dict[str, Callable[[np.ndarray], list[int]]]:
    out: dict[str, Callable[[np.ndarray], list[int]]] = {"perfguard": perfguard}
    for name, fn, module in (
        ("Otava 0.8", otava, "otava"),
        ("ruptures BinSeg", ruptures_binseg, "ruptures"),
    ):
        try:
            __import__(module)
            out[name] = fn
        except ImportError:
            print(f"{name}: not installed ({module}), left out")
    try:
        __import__("signal_processing_algorithms")
        out["MongoDB e-divisive"] = spa_e_divisive
    except ImportError:
        if spa_python:
            out["MongoDB e-divisive"] = Worker(spa_python, "spa")
        else:
            print(
                "MongoDB e-divisive: signal_processing_algorithms not importable and no "
                "--spa-python, left out"
            )
    return out


def timed(fn: Callable[[np.ndarray], list[int]], x: np.ndarray) -> tuple[list[int], float]:
    """(found, wall seconds) of one detector on one series."""
    return timed_cpu(fn, x)[:2]


def timed_cpu(
    fn: Callable[[np.ndarray], list[int]], x: np.ndarray
) -> tuple[list[int], float, float]:
    """(found, wall seconds, CPU seconds of the detecting thread): on a shared machine the
    CPU time is the steadier of the two."""
    t, c = time.perf_counter(), time.thread_time()
    found = fn(x)
    wall, cpu = time.perf_counter() - t, time.thread_time() - c
    if isinstance(fn, Worker):
        return found, fn.last_seconds, fn.last_cpu
    return found, wall, cpu


# ------------------------------------------------------------------ tables


#: seed of the split of each suite into halves: perfguard's bars were chosen on the first
#: ("tune"), the second ("held out") is reported beside it to show they were not fitted to it
HALF_SEED = 33


def tune_half(n: int, seed: int = HALF_SEED) -> set[int]:
    """Indices of the tuning half of a suite of ``n`` series (a fixed random half)."""
    return set(np.random.default_rng(seed).permutation(n)[: n // 2].tolist())


def run_points(name: str, suite: list[Series], dets: dict, margin: int) -> dict[str, dict]:
    print(
        f"\n## {name}: {len(suite)} series, {sum(len(t) for _, _, t, _ in suite)} changes, "
        f"margin {margin}"
    )
    print(
        "| detector | precision | recall | F1 | F1 tune half | F1 held-out half "
        "| regression-and-fix found | ms / series |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results = {}
    tune = tune_half(len(suite))
    for det, fn in dets.items():
        counts = {half: [0, 0, 0] for half in ("tune", "held out")}  # tp, found, true
        fix_total = fix_found = 0
        seconds = 0.0
        for i, (_, x, truth, fix) in enumerate(suite):
            found, s = timed(fn, x)
            seconds += s
            c = counts["tune" if i in tune else "held out"]
            for k, v in enumerate((match(truth, found, margin), len(found), len(truth))):
                c[k] += v
            if fix:
                fix_total += 1
                fix_found += match([(j, j) for j in fix], found, margin) == len(fix)
        p, r, f = prf(*(a + b for a, b in zip(*counts.values(), strict=True)))
        f_tune, f_held = (prf(*c)[2] for c in counts.values())
        fixes = f"{fix_found}/{fix_total}" if fix_total else "-"
        results[det] = {
            "precision": p,
            "recall": r,
            "f1": f,
            "f1_tune": f_tune,
            "f1_held_out": f_held,
            "fix": fixes,
            "ms": 1000 * seconds / len(suite),
        }
        print(
            f"| {det} | {p:.3f} | {r:.3f} | {f:.3f} | {f_tune:.3f} | {f_held:.3f} | {fixes} "
            f"| {1000 * seconds / len(suite):.1f} |"
        )
    return results


def run_tcpd(suite: list, dets: dict) -> dict[str, float]:
    print(f"\n## TCPD: {len(suite)} univariate series, default F1 (margin 5, annotators combined)")
    print("| detector | mean F1 | F1 tune half | F1 held-out half | ms / series |")
    print("|---|---|---|---|---|")
    tune = np.array([i in tune_half(len(suite)) for i in range(len(suite))])

    def line(name: str, scores: np.ndarray, ms: str) -> None:
        print(
            f"| {name} | {scores.mean():.3f} | {scores[tune].mean():.3f} "
            f"| {scores[~tune].mean():.3f} | {ms} |"
        )

    zero = np.array([tcpd_f1(ann, []) for _, _, ann in suite])
    line("no change point (zero)", zero, "-")
    results = {"zero": float(zero.mean())}
    for det, fn in dets.items():
        scores, seconds = [], 0.0
        for _, x, ann in suite:
            found, s = timed(fn, x)
            seconds += s
            scores.append(tcpd_f1(ann, found))
        results[det] = float(np.mean(scores))
        line(det, np.array(scores), f"{1000 * seconds / len(suite):.1f}")
    return results


def run_speed(dets: dict, n_series: int = 35) -> None:
    suite = ci_kit(n_per_shape=n_series // len(CI_SHAPES), seed=7, length=200)
    print(f"\n## time per 200-point series ({len(suite)} CI-kit series, 200 runs each)")
    print("| detector | wall ms / series (mean) | wall ms (max) | CPU ms / series (mean) |")
    print("|---|---|---|---|")
    for det, fn in dets.items():
        times = np.array([timed_cpu(fn, x)[1:] for _, x, _, _ in suite])
        wall, cpu = times[:, 0], times[:, 1]
        print(
            f"| {det} | {1000 * wall.mean():.1f} | {1000 * wall.max():.1f} | "
            f"{1000 * cpu.mean():.1f} |"
        )


def calibrate(n_series: int = 600, seed: int = 2) -> None:
    """The largest level and spread z that perfguard's searches find in series of
    independent normal values (no change at all): their 95th, 98th, 99th and 99.5th
    percentiles by length, and the line ``a + b log(n / 50)`` through each (the spread's
    from 50 runs on, where it has room for candidates), which the bars in
    ``perfguard/compare/changepoint.py`` come from."""
    rng = np.random.default_rng(seed)
    lengths = (12, 20, 30, 50, 75, 100, 150, 200, 300, 500, 800)
    qs = (0.95, 0.98, 0.99, 0.995)
    level: dict[int, list[float]] = {}
    spread: dict[int, list[float]] = {}
    print(f"\n## largest z in pure normal noise ({n_series} series per length)")
    print("| runs | level z q95 / q98 / q99 / q99.5 | spread z q95 / q98 / q99 / q99.5 |")
    print("|---|---|---|")
    for n in lengths:
        level[n], spread[n] = [], []
        for _ in range(n_series):
            x = rng.standard_normal(n)
            found = detect(x, step_z=1e9, variance_z=0.0)  # every spread candidate kept
            spread[n].append(max((s.z for s in found if s.kind == "variance"), default=0.0))
            found = detect(x, step_z=0.0, variance_z=1e9)
            level[n].append(max((s.z for s in found if s.kind != "variance"), default=0.0))
        cells = [" / ".join(f"{v:.2f}" for v in np.quantile(z[n], qs)) for z in (level, spread)]
        print(f"| {n} | {cells[0]} | {cells[1]} |")
    for name, z, lo in (("level", level, 20), ("spread", spread, 50)):
        ns = [n for n in lengths if n >= lo]
        for q in qs:
            b, a = np.polyfit(np.log(np.array(ns) / 50), [np.quantile(z[n], q) for n in ns], 1)
            print(f"{name} q{100 * q:g}: {a:.2f} + {b:.2f} log(n / 50)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tcpd", type=Path, help="a checkout of the Turing Change Point Dataset")
    ap.add_argument("--spa-python", help="interpreter with signal_processing_algorithms")
    ap.add_argument("--only", nargs="+", choices=("otava", "ci", "tcpd", "speed"))
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="the bars' null quantiles (pure normal noise), then exit",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.calibrate:
        calibrate()
        return 0
    only = set(args.only or ("otava", "ci", "tcpd", "speed"))
    dets = detectors(args.spa_python)
    if "otava" in only:
        try:
            run_points("Otava generated suite", otava_suite(), dets, margin=5)
        except ImportError:
            print("Otava suite: otava-test-data is not installed (pip install otava-test-data)")
    if "ci" in only:
        run_points("CI-history kit", ci_kit(), dets, margin=1)
    if "tcpd" in only:
        if args.tcpd:
            run_tcpd(tcpd_suite(args.tcpd), dets)
        else:
            print("TCPD: no --tcpd checkout given, left out")
    if "speed" in only:
        run_speed(dets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
