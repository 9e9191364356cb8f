"""How every view writes a counter or a time (``compare/units.py``): SI prefixes, and a
value that rounds up to 1,000 of one prefix written with the next, never as ``1e+03 kB``
(a gate message of a tiny GPT's backward read ``1.02 MB → 0 B; ... 0 B → 1e+03 kB``)."""

from __future__ import annotations

import pytest

from perfguard.compare.units import format_ns, human


@pytest.mark.parametrize(
    ("value", "counter", "text"),
    [
        (999_700, "bytes", "1 MB"),  # 999.7 kB rounds to 1.00e3 kB: the next prefix
        (999_400, "bytes", "999 kB"),
        (999.6, "bytes", "1 kB"),
        (5, "bytes", "5 B"),
        (0, "bytes", "0 B"),
        (-999_700, "memcpy_bytes", "-1 MB"),
        (1e15, "bytes", "1,000 TB"),  # past the largest prefix: whole
        (2.5e6, "flops", "2.5 MFLOP"),
        (3_585_231.6, "instructions", "3.585 M instr"),
        (999_960, "instructions", "1 M instr"),
        (12, "instructions", "12 instr"),
        (1824, "calls", "1,824"),
        (3.5, "calls", "3.5"),
        ("fp32", "dtypes", "fp32"),
        (None, "bytes", "n/a"),
        (float("nan"), "bytes", "n/a"),
    ],
)
def test_counters_read_with_prefixes(value, counter, text) -> None:
    assert human(value, counter) == text


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (5, "5 ns"),
        (999.9, "1 us"),
        (999_999, "1 ms"),
        (7.03e6, "7.03 ms"),
        (1.5e9, "1.5 s"),
        (9.996e11, "1,000 s"),
        (-2000, "-2 us"),
        (None, "n/a"),
    ],
)
def test_times_read_in_their_unit(ns, text) -> None:
    assert format_ns(ns) == text
