"""What narrower column types would save in the tables a large analysis keeps.

The dense-NVTX memory targets of issue 15 are set by the tables alive during
the analysis (the Trace and the ``Analysis`` tables), not by transient
copies. This measures, on a real capture, each kept table as it is and as
it would be with

* the integer columns that are row numbers, codes or small counts
  (:data:`NARROW_INTS`) stored as int32 where the values fit; times,
  durations, process and thread ids and correlation ids stay int64 (they
  outgrow int32 in real captures), and
* text columns with few distinct values (under a quarter of the rows) stored
  as categoricals (op and kernel names, op types, directions, shapes).

It was the measurement behind round 9's change of the public tables' dtypes
(``docs/design.md``, "Column types"); on today's tables it shows what is left
(at 4.8M ranges: 882 MiB as they are, 872 MiB narrowed further, the device ids
the model keeps int64). Buffers shared by several columns (the reader's one
all-missing column) are counted once, before and after.

Usage::

    python benchmarks/narrow_tables.py /tmp/big/large_nsys_1000000.sqlite
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

INT32 = (-(2**31), 2**31)
#: integer columns bounded by the number of rows, ops or devices
NARROW_INTS = frozenset(
    {
        "rank",
        "device_id",
        "depth",
        "parent_id",
        "range_id",
        "kernel_row",
        "instance",
        "instance_row",
        "op_key",
        "kernel_count",
        "memop_count",
    }
)


def table_bytes(df: pd.DataFrame) -> int:
    """Bytes of ``df``'s column buffers, a buffer shared by several columns once
    (object columns: the pointers, not the strings, which the rows share)."""
    seen: set[int] = set()
    total = 0
    for col in df.columns:
        s = df[col]
        if isinstance(s.dtype, np.dtype) or str(s.dtype) == "str":
            values = np.asarray(s.array)
            key = values.__array_interface__["data"][0]
            if key in seen:
                continue
            seen.add(key)
        total += int(s.memory_usage(index=False, deep=False))
    return total


def narrowed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its :data:`NARROW_INTS` as int32 and repetitive text as categoricals."""
    out = {}
    for col in df.columns:
        s = df[col]
        if s.dtype == object or str(s.dtype) == "str":
            repetitive = s.nunique(dropna=False) < len(s) // 4
            out[col] = s.astype("category") if repetitive else s
        elif (
            col in NARROW_INTS
            and s.dtype == np.int64
            and len(s)
            and INT32[0] <= s.min()
            and s.max() < INT32[1]
        ):
            out[col] = s.astype(np.int32)
        else:
            out[col] = s
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("capture", help="nsys .sqlite export or Kineto trace")
    args = parser.parse_args()

    import perfguard

    t0 = time.perf_counter()
    trace = perfguard.load_trace(args.capture)
    result = perfguard.analyze(trace)
    print(f"{args.capture}: read and analysed in {time.perf_counter() - t0:.1f} s\n")
    tables = {
        "trace.ranges": trace.ranges,
        "trace.kernels": trace.kernels,
        "trace.api_calls": trace.api_calls,
        "trace.memops": trace.memops,
        "activities": result.activities,
        "kept_instances": result.kept_instances,
    }
    print(f"{'table':16s} {'rows':>11s} {'now MiB':>8s} {'narrow MiB':>10s}")
    before = after = 0
    for name, df in tables.items():
        b, a = table_bytes(df), table_bytes(narrowed(df))
        before, after = before + b, after + a
        print(f"{name:16s} {len(df):>11,} {b / 2**20:>8.0f} {a / 2**20:>10.0f}")
    print(f"{'all':16s} {'':>11s} {before / 2**20:>8.0f} {after / 2**20:>10.0f}")


if __name__ == "__main__":
    main()
