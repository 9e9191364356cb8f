"""Time the XSpace reader on a large capture: the real TF custom-loop fixture, replicated.

``tests/data/xplane/tf_custom_loop.xplane.pb`` (3 steps of a ``tf.function``
train step) is copied N times inside one XSpace: every line's events are
repeated with their offsets shifted by k capture spans, and step numbers
renumbered, so the result is a real capture's structure at N times its
length. Prints events read, seconds (best of ``--repeat``) and events/s,
and checks that ranges scale exactly with N.

    python benchmarks/xplane_read.py --events 1000000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from perfguard.trace.xplane import read_xplane
from perfguard.trace.xspace_proto import xspace_class

FIXTURE = (
    Path(__file__).resolve().parents[1] / "tests" / "data" / "xplane" / "tf_custom_loop.xplane.pb"
)


def replicate(copies: int) -> tuple[bytes, int]:
    space = xspace_class()()
    space.ParseFromString(FIXTURE.read_bytes())
    events = 0
    for plane in space.planes:
        step_stat = [e.key for e in plane.stat_metadata if e.value.name == "step_num"]
        for line in plane.lines:
            orig = list(line.events)
            if not orig:
                continue
            span = max(e.offset_ps + e.duration_ps for e in orig) + 1_000_000
            steps = 1 + max(
                (s.int64_value for e in orig for s in e.stats if s.metadata_id in step_stat),
                default=0,
            )
            for k in range(1, copies):
                for e in orig:
                    c = line.events.add()
                    c.CopyFrom(e)
                    c.offset_ps = e.offset_ps + k * span
                    for s in c.stats:
                        if s.metadata_id in step_stat:
                            s.int64_value += k * steps
            events += len(line.events)
    return space.SerializeToString(), events


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base = replicate(1)[1]
    copies = max(1, -(-args.events // base))
    data, events = replicate(copies)
    ranges_one = len(read_xplane(FIXTURE).ranges)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.xplane.pb"
        path.write_bytes(data)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            trace = read_xplane(path)
            best = min(best, time.perf_counter() - t0)
        mib = path.stat().st_size / 2**20
    assert len(trace.ranges) == copies * ranges_one, (len(trace.ranges), copies * ranges_one)
    print(
        f"{events:,} events ({mib:.1f} MiB in {copies:,} copies), "
        f"{len(trace.ranges):,} ranges: {best:.2f} s best of {args.repeat}, "
        f"{events / best / 1e6:.2f} M events/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
