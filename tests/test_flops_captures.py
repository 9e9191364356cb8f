"""Every op record of the real captures costed as before: the FLOP formulas' golden file.

``tests/data/flops_captures.json.gz`` holds each distinct op record (name, shapes, dtypes,
concrete inputs) that has a formula in every real capture (``shared/fixtures``'s Kineto and
nsys files, ``tests/data/gpu_h200``), with the FLOPs, bytes, compute dtype, formula text and
family that ``op_flops`` gave it, and the registry's op names. It was written once from the
single-module ``flops.py``, before the formulas were split by op family; the test replays the
records, so it needs no capture and no reader, and any change of a figure or of the registry
shows up per capture and per record. A deliberate change of a formula rewrites the file:
``PERFGUARD_FIXTURES=... python tests/test_flops_captures.py``, and the diff is the review.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from perfguard.analysis.flops import FORMULAS, op_cost, op_flops
from perfguard.analysis.flops.core import formula

GOLDEN = Path(__file__).parent / "data" / "flops_captures.json.gz"
COLUMNS = ("flops", "bytes", "compute_dtype", "flop_formula", "family")
STRIDE = 8  # one argument list in STRIDE crosses every formula


def _load() -> dict[str, Any]:
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as fh:
        return json.load(fh)


GOLD = _load() if GOLDEN.exists() else {"registry": [], "captures": {}, "records": []}


def _plain(v: Any) -> Any:
    """A cell as JSON keeps it: NA -> None, whole floats stay floats, Int64 -> int."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def _cost(records: list[list[Any]]) -> list[list[Any]]:
    """``op_flops`` of the records ``[name, input_shapes, dtypes, concrete_inputs, ...]``."""
    frame = pd.DataFrame(
        [r[:4] for r in records], columns=["name", "input_shapes", "dtypes", "concrete_inputs"]
    )
    out = op_flops(frame)
    return [[_plain(v) for v in row] for row in out[list(COLUMNS)].itertuples(index=False)]


def test_the_registry_names_the_same_ops() -> None:
    assert sorted(FORMULAS) == GOLD["registry"]


@pytest.mark.parametrize("capture", sorted(GOLD["captures"]))
def test_every_record_of_a_capture_costs_as_before(capture: str) -> None:
    records = [GOLD["records"][i] for i in GOLD["captures"][capture]]
    got = _cost(records)
    wrong = [
        f"{r[0]} {r[1]} {r[2]} {r[3]}: {dict(zip(COLUMNS, r[4:], strict=True))} -> "
        f"{dict(zip(COLUMNS, g, strict=True))}"
        for r, g in zip(records, got, strict=True)
        if list(r[4:]) != g
    ]
    assert wrong == [], f"{len(wrong)} of {len(records)} records changed:\n" + "\n".join(wrong[:5])


def _crossed(records: list[list[Any]]) -> dict[str, str]:
    """Per registry op, a digest of its costs over a sample of every capture's argument lists
    (most of them another op's): each formula's edges and error paths, not only its own ops."""
    args = sorted({json.dumps(r[1:4]) for r in records})[::STRIDE]
    out = {}
    for op in sorted(FORMULAS):
        costs = [list(op_cost(op, *json.loads(a)).__dict__.values()) for a in args]
        out[op] = hashlib.sha256(json.dumps(costs).encode()).hexdigest()[:16]
    return out


def test_every_formula_costs_other_ops_records_as_before() -> None:
    got = _crossed(GOLD["records"])
    assert [op for op in GOLD["crossed"] if got.get(op) != GOLD["crossed"][op]] == []


def test_the_golden_file_covers_the_families() -> None:
    """The replay is not vacuous: real records of every contraction family and more."""
    families = {r[8] for r in GOLD["records"]}
    assert {"gemm", "conv", "attention", "elementwise", "norm", "copy"} <= families
    assert sum(r[4] is not None and r[4] > 0 for r in GOLD["records"]) > 300


def test_an_op_has_one_formula_and_an_aten_name() -> None:
    """The registry refuses a second home for an op, and a name that is not an aten op,
    before it registers anything."""
    before = dict(FORMULAS)
    for names in (("aten::mm",), ("aten::not_an_op_yet", "aten::not_an_op_yet"), ("mm",)):
        with pytest.raises(ValueError, match="two formulas|name an aten op"):
            formula(*names)
    assert FORMULAS == before


# --------------------------------------------------------------------------- writing the file


def _captures(fixtures: Path) -> list[tuple[str, Path]]:
    here = Path(__file__).parent / "data" / "gpu_h200"
    found = [
        *(
            ("kineto/" + str(p.relative_to(fixtures / "kineto")), p)
            for p in sorted((fixtures / "kineto").rglob("*.json.gz"))
        ),
        *(("nsys/" + p.name, p) for p in sorted((fixtures / "nsys").glob("*.sqlite"))),
        *(("gpu_h200/" + p.name, p) for p in sorted(here.glob("*.json.gz"))),
    ]
    return found


def _records_of(path: Path) -> list[list[Any]]:
    """The distinct shaped op records of one capture whose name has a formula, in order."""
    from perfguard.analysis.enrich import _formula_keys
    from perfguard.trace import load_trace

    r = load_trace(path).ranges
    sub = r[(r["kind"] == "op").to_numpy(bool) & r["input_shapes"].notna().to_numpy(bool)]
    names = _formula_keys(sub) if len(sub) else pd.Series([], dtype=object)
    cols = [names, sub["input_shapes"], sub["dtypes"], sub["concrete_inputs"]]
    seen: dict[tuple[Any, ...], None] = {}
    for row in zip(*(c.to_numpy(dtype=object) for c in cols), strict=True):
        rec = tuple(_plain(v) for v in row)
        key = rec[0][6:] if isinstance(rec[0], str) and rec[0].startswith("aten::") else rec[0]
        if key in FORMULAS:
            seen.setdefault(rec)
    return [list(rec) for rec in seen]


def write(fixtures: Path) -> None:
    """Cost every capture's records with the code as it is now and write the golden file."""
    index: dict[str, int] = {}
    records: list[list[Any]] = []
    captures: dict[str, list[int]] = {}
    for name, path in _captures(fixtures):
        mine = _records_of(path)
        if not mine:
            continue
        for rec, cost in zip(mine, _cost(mine), strict=True):
            key = json.dumps(rec)
            if key not in index:
                index[key] = len(records)
                records.append(rec + cost)
        captures[name] = [index[json.dumps(rec)] for rec in mine]
    doc = {
        "registry": sorted(FORMULAS),
        "captures": captures,
        "records": records,
        "crossed": _crossed(records),
    }
    with gzip.GzipFile(GOLDEN, "wb", mtime=0) as fh:
        fh.write(json.dumps(doc, separators=(",", ":")).encode())
    print(f"{GOLDEN}: {len(records)} records of {len(captures)} captures")


if __name__ == "__main__":
    import os

    write(Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["PERFGUARD_FIXTURES"]))
