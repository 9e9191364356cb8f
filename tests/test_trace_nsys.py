"""The nsys SQLite reader against independent SQL over the real exports.

Every expected value here is computed in the test with plain ``sqlite3``
queries over the export (pid/tid decoded from ``globalTid`` in SQL, names
joined from ``StringIds`` in SQL), never by calling perfguard code. The
reader's tables are then compared row by row as sorted multisets.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

NSYS_2026 = "nsys/nsys2026.2.1_pytorch-torchrun-train_nvtx_nccl_2gpu_derived-window.sqlite"
NSYS_2024_6 = "nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite"
NSYS_2022 = "nsys/nsys2022.2.1_mpi-saxpy_nvtx_a100.sqlite"
NSYS_2021 = "nsys/nsys2021.2.1_gpu-db-query_no-nvtx_quadro-rtx6000.sqlite"

PID = "((({c}) >> 24) & 16777215)"  # (g >> 24) & 0xFFFFFF
TID = "(({c}) & 16777215)"  # g & 0xFFFFFF
#: nsys ENUM_CUDA_MEMCPY_OPER ids -> the kind labels Kineto uses for the same copies
COPY_KIND_LABEL = {1: "Memcpy HtoD", 2: "Memcpy DtoH", 8: "Memcpy DtoD"}
#: PyTorch emit_nvtx suffixes that the reader splits off range names
PYTORCH_SUFFIX = re.compile(r",\s*(?:stashed seq|seq|op_id|sizes|input_op_ids)\s*=")


def pid_sql(col: str) -> str:
    return PID.format(c=col)


def tid_sql(col: str) -> str:
    return TID.format(c=col)


class Export:
    """Read-only SQL access to one export, for expected values."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        self.tables = {
            r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }

    def q(self, sql: str, *args) -> list[tuple]:
        return self.conn.execute(sql, args).fetchall()

    def one(self, sql: str, *args):
        return self.conn.execute(sql, args).fetchone()[0]

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.conn.execute(f"PRAGMA table_info('{table}')")}


@pytest.fixture(scope="module")
def export(nsys_file: Path):
    db = Export(nsys_file)
    yield db
    db.conn.close()


@pytest.fixture(scope="module")
def trace(nsys_file: Path, cached_trace):
    return cached_trace(nsys_file)


def _rows(df: pd.DataFrame, cols: list[str]) -> list[tuple]:
    """DataFrame rows as plain Python tuples (NA -> None), sorted."""
    out = []
    for row in df[cols].itertuples(index=False, name=None):
        out.append(tuple(None if (v is None or v is pd.NA or v != v) else v for v in row))
    return sorted(out, key=lambda r: tuple((v is None, v if v is not None else 0) for v in r))


def _sorted(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=lambda r: tuple((v is None, v if v is not None else 0) for v in r))


def _norm(v):
    """Python/numpy scalar -> plain Python value for comparison."""
    if isinstance(v, np.integer):
        return int(v)
    return v


# --------------------------------------------------------------------------- kernels


def test_kernel_count_and_total_time(export: Export, trace) -> None:
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    n, total = export.q(f"SELECT count(*), coalesce(sum(end - start), 0) FROM {t}")[0]
    assert len(trace.kernels) == n
    assert int((trace.kernels["end"] - trace.kernels["start"]).sum()) == total
    assert trace.kernels["start"].dtype == np.int64 and trace.kernels["end"].dtype == np.int64


def test_kernel_rows_match_sql(export: Export, trace) -> None:
    """Every kernel: times, device, stream, correlation, pid from globalPid, both names."""
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    expected = export.q(
        f"SELECT k.start, k.end, k.deviceId, k.streamId, k.correlationId,"
        f" {pid_sql('k.globalPid')}, d.value, s.value, k.gridX, k.gridY, k.gridZ,"
        f" k.blockX, k.blockY, k.blockZ, k.registersPerThread"
        f" FROM {t} k LEFT JOIN StringIds d ON d.id = k.demangledName"
        f" LEFT JOIN StringIds s ON s.id = k.shortName"
    )
    cols = [
        "start",
        "end",
        "device_id",
        "stream_id",
        "correlation_id",
        "pid",
        "name",
        "short_name",
        "grid_x",
        "grid_y",
        "grid_z",
        "block_x",
        "block_y",
        "block_z",
        "registers",
    ]
    got = [tuple(_norm(v) for v in r) for r in _rows(trace.kernels, cols)]
    assert got == _sorted(expected)


def test_kernel_demangled_differs_from_short_name(export: Export, trace) -> None:
    """``name`` is the demangled StringIds entry, ``short_name`` the base name."""
    n_diff = export.one(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE demangledName != shortName"
    )
    k = trace.kernels
    # coded text: two columns' codes compare only as text
    assert int((k["name"].astype(object) != k["short_name"].astype(object)).sum()) == n_diff
    if len(k):
        # a short name never carries a parameter list; the demangled one may
        assert not k["short_name"].str.contains(r"\(", regex=True).any()


def test_kernel_shared_memory_is_static_plus_dynamic(export: Export, trace) -> None:
    total = export.one(
        "SELECT coalesce(sum(staticSharedMemory + dynamicSharedMemory), 0)"
        " FROM CUPTI_ACTIVITY_KIND_KERNEL"
    )
    assert int(trace.kernels["shared_mem"].sum()) == total


# --------------------------------------------------------------------------- API calls


def test_api_calls_are_runtime_and_driver_rows_only(export: Export, trace) -> None:
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    expected = export.q(
        f"SELECT r.start, r.end, {pid_sql('r.globalTid')}, {tid_sql('r.globalTid')},"
        f" r.correlationId, s.value FROM {t} r JOIN StringIds s ON s.id = r.nameId"
        f" WHERE r.eventClass IN (0, 1)"
    )
    expected = [(*r[:5], re.sub(r"_v\d+$", "", r[5])) for r in expected]
    got = [
        tuple(_norm(v) for v in r)
        for r in _rows(trace.api_calls, ["start", "end", "pid", "tid", "correlation_id", "name"])
    ]
    assert got == _sorted(expected)


def test_backtrace_duplicates_are_dropped(fixture_file, cached_trace) -> None:
    """2022.2.1 was captured with CUDA backtraces: eventClass 67 repeats each call."""
    db = Export(fixture_file(NSYS_2022))
    all_rows = db.one("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    api_rows = db.one("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0,1)")
    dup_rows = db.one("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 67")
    db.conn.close()
    assert dup_rows > 0 and all_rows == api_rows + dup_rows  # the fixture has what we test
    api = cached_trace(fixture_file(NSYS_2022)).api_calls
    assert len(api) == api_rows
    assert not api["correlation_id"].duplicated().any()
    # the backtrace rows are named 'cudaLaunchKernel', the real ones 'cudaLaunchKernel_v7000':
    # after stripping the version suffix each launch must appear once, not twice
    launches = api[api["name"] == "cudaLaunchKernel"]
    assert len(launches) == len(cached_trace(fixture_file(NSYS_2022)).kernels)


def test_pid_tid_decoding_sample(fixture_file, cached_trace) -> None:
    """MANIFEST: globalTid 0x100085e00085e -> pid 2142, tid 2142 (2021.2.1 file)."""
    tr = cached_trace(fixture_file(NSYS_2021))
    assert ((tr.api_calls["pid"] == 2142) & (tr.api_calls["tid"] == 2142)).any()
    assert (tr.threads[["pid", "tid"]] == [2142, 2142]).all(axis=1).any()
    # nothing keeps the VM id bit (1 << 48) or lands above 24 bits
    for df in (tr.api_calls, tr.threads):
        assert df["pid"].between(0, 0xFFFFFF).all() and df["tid"].between(0, 0xFFFFFF).all()


# --------------------------------------------------------------------------- memops


def test_memops_counts_bytes_and_kinds(export: Export, trace) -> None:
    expected: Counter = Counter()
    nbytes: Counter = Counter()
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in export.tables:
        for kind, n, b in export.q(
            "SELECT copyKind, count(*), coalesce(sum(bytes), 0)"
            " FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"
        ):
            expected[COPY_KIND_LABEL[kind]] += n
            nbytes[COPY_KIND_LABEL[kind]] += b
    if "CUPTI_ACTIVITY_KIND_MEMSET" in export.tables:
        n, b = export.q("SELECT count(*), coalesce(sum(bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMSET")[
            0
        ]
        if n:
            expected["Memset"] += n
            nbytes["Memset"] += b
    m = trace.memops
    assert Counter(m["kind"]) == expected
    got_bytes = {k: int(v) for k, v in m.groupby("kind")["bytes"].sum().items()}
    assert got_bytes == dict(nbytes)


def test_memop_rows_match_sql(export: Export, trace) -> None:
    expected = []
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table in export.tables:
            expected += export.q(
                f"SELECT start, end, deviceId, streamId, correlationId,"
                f" {pid_sql('globalPid')}, bytes FROM {table}"
            )
    cols = ["start", "end", "device_id", "stream_id", "correlation_id", "pid", "bytes"]
    got = [tuple(_norm(v) for v in r) for r in _rows(trace.memops, cols)]
    assert got == _sorted(expected)


# --------------------------------------------------------------------------- devices, threads, meta


def test_devices_from_target_info_gpu(export: Export, trace) -> None:
    if "TARGET_INFO_GPU" not in export.tables:
        # the 2026.2 window cuts carry no GPU table: an empty devices table, not a guess
        assert trace.devices.empty
        assert list(trace.devices.columns)[:3] == ["rank", "device_id", "name"]
        return
    expected = export.q(
        "SELECT id, name, smCount, totalMemory, computeMajor || '.' || computeMinor"
        " FROM TARGET_INFO_GPU"
    )
    cols = ["device_id", "name", "sm_count", "memory_bytes", "compute_capability"]
    got = [tuple(_norm(v) for v in r) for r in _rows(trace.devices, cols)]
    assert got == _sorted(expected)


def test_no_devices_in_2026_window(fixture_file, cached_trace) -> None:
    path = fixture_file(NSYS_2026)
    db = Export(path)
    assert "TARGET_INFO_GPU" not in db.tables
    db.conn.close()
    tr = cached_trace(path)
    assert len(tr.devices) == 0 and len(tr.kernels) > 0


def test_threads_from_thread_names(export: Export, trace) -> None:
    n = export.one(
        f"SELECT count(*) FROM (SELECT DISTINCT {pid_sql('globalTid')}, {tid_sql('globalTid')}"
        f" FROM ThreadNames)"
    )
    assert len(trace.threads) == n
    assert not trace.threads.duplicated(["pid", "tid"]).any()


def test_meta_version(export: Export, trace, nsys_file: Path) -> None:
    from_name = re.match(r"nsys(\d{4}\.\d+\.\d+)_", nsys_file.name).group(1)
    assert trace.meta["format"] == "nsys-sqlite"
    table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in export.tables), None)
    if table is None:
        # no version table before 2022.1: inferred from install paths in the export
        paths = export.one(
            "SELECT count(*) FROM StringIds WHERE value LIKE ?",
            f"%nsight-systems/{from_name}/%",
        )
        assert paths > 0
        assert trace.meta["version"] == from_name
        assert "inferred" in trace.meta["version_source"]
    else:
        expected = export.one(f"SELECT value FROM {table} WHERE name = 'EXPORT_PRODUCT_VERSION'")
        assert trace.meta["version"] == expected
        assert expected.startswith(from_name + ".")


def test_meta_version_2021_is_inferred(fixture_file, cached_trace) -> None:
    tr = cached_trace(fixture_file(NSYS_2021))
    assert tr.meta["version"] == "2021.2.1"
    assert tr.meta["version_source"] == "inferred from install paths"


# --------------------------------------------------------------------------- NVTX ranges


def _expected_ranges(export: Export) -> list[tuple]:
    """(start, end, pid, tid, raw name, domain name or None) for every NVTX range."""
    if "NVTX_EVENTS" not in export.tables:
        return []
    # domains are declared per process by eventType 75 rows
    domains = {
        (pid, dom): name
        for pid, dom, name in export.q(
            f"SELECT {pid_sql('d.globalTid')}, d.domainId, coalesce(d.text, ds.value)"
            f" FROM NVTX_EVENTS d LEFT JOIN StringIds ds ON ds.id = d.textId"
            f" WHERE d.eventType = 75"
        )
    }
    rows = export.q(
        f"SELECT n.start, n.end, {pid_sql('n.globalTid')}, {tid_sql('n.globalTid')},"
        f" coalesce(n.text, s.value), n.domainId"
        f" FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId"
        f" WHERE n.eventType IN (59, 60, 70, 71)"
    )
    return [(s, e, p, t, name, domains.get((p, dom))) for s, e, p, t, name, dom in rows]


def _base_name(raw: str) -> str:
    m = PYTORCH_SUFFIX.search(raw)
    return (raw[: m.start()] if m else raw).strip()


def _seq(raw: str):
    m = re.search(r",\s*(?:stashed )?seq\s*=\s*(\d+)", raw)
    return int(m.group(1)) if m else None


def test_nvtx_ranges_match_sql(export: Export, trace) -> None:
    rows = _expected_ranges(export)
    r = trace.ranges
    assert len(r) == len(rows)
    if not rows:
        return
    assert not any(row[1] is None for row in rows), "fixture has unterminated ranges"
    expected = [(s, e, p, t, _base_name(raw), _seq(raw), dom) for s, e, p, t, raw, dom in rows]
    got = [
        tuple(_norm(v) for v in row)
        for row in _rows(r, ["start", "end", "pid", "tid", "name", "seq", "domain"])
    ]
    assert got == _sorted(expected)
    assert set(r["category"]) == {"nvtx"}
    assert set(r["source"]) <= {"nvtx:push_pop", "nvtx:start_end"}


def test_nvtx_range_names_coalesce_text_and_registered_strings(export: Export, trace) -> None:
    if "NVTX_EVENTS" not in export.tables:
        assert trace.ranges.empty
        return
    registered = export.q(
        "SELECT DISTINCT s.value FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId"
        " WHERE n.eventType IN (59, 60, 70, 71) AND n.text IS NULL"
    )
    names = set(trace.ranges["name"])
    assert None not in names
    for (value,) in registered:
        assert _base_name(value) in names


def test_pytorch_suffixes_split_into_seq(fixture_file, cached_trace) -> None:
    path = fixture_file(NSYS_2026)
    db = Export(path)
    raw = db.q(
        "SELECT start, end, globalTid, text FROM NVTX_EVENTS WHERE eventType = 59"
        " AND text LIKE '%seq = %'"
    )
    n_op_id = db.one("SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE '%op_id =%'")
    db.conn.close()
    assert raw and n_op_id > 0  # the fixture carries PyTorch emit_nvtx names
    r = cached_trace(path).ranges
    assert not r["name"].str.contains("op_id =", regex=False).any()
    assert not r["name"].str.contains("seq =", regex=False).any()
    assert int(r["seq"].notna().sum()) == len(raw)
    got = {
        (s, e, p, t): q
        for s, e, p, t, q in r[r["seq"].notna()][["start", "end", "pid", "tid", "seq"]]
        .astype("int64")
        .itertuples(index=False, name=None)
    }
    for start, end, gtid, text in raw:
        key = (start, end, (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF)
        number = int(re.search(r"seq = (\d+)", text).group(1))
        assert got[key] == number, text
    # the split name is the text before the first ', ' suffix, e.g. 'aten::mul'
    assert "aten::mul" in set(r["name"])


def test_mpi_domain_name(fixture_file, cached_trace) -> None:
    path = fixture_file(NSYS_2022)
    db = Export(path)
    mpi_ranges = db.one(
        "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59 AND domainId = "
        "(SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = 'MPI')"
    )
    db.conn.close()
    r = cached_trace(path).ranges
    assert mpi_ranges == 17
    assert int((r["domain"] == "MPI").sum()) == mpi_ranges
    assert set(r.loc[r["domain"] == "MPI", "name"]) == {
        "MPI_Init",
        "MPI_Send",
        "MPI_Recv",
        "MPI_Finalize",
    }
    # default-domain ranges carry no domain name
    assert r.loc[r["name"] == "saxpy", "domain"].isna().all()


# ------------------------------------------------------------------------- correlation per process


def test_correlation_ids_reused_across_pids(fixture_file, cached_trace) -> None:
    """2026.2: two processes reuse correlation ids; joins must carry the pid."""
    path = fixture_file(NSYS_2026)
    db = Export(path)
    by_id = db.one(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k"
        " JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId"
        " WHERE r.eventClass IN (0, 1)"
    )
    by_id_pid = db.one(
        f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k"
        f" JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId"
        f" AND {pid_sql('r.globalTid')} = {pid_sql('k.globalPid')} WHERE r.eventClass IN (0, 1)"
    )
    pids = db.q(f"SELECT DISTINCT {pid_sql('globalPid')} FROM CUPTI_ACTIVITY_KIND_KERNEL")
    db.conn.close()
    n_kernels = len(cached_trace(path).kernels)
    assert by_id > n_kernels > by_id_pid  # the collision really is in the fixture
    tr = cached_trace(path)
    assert set(tr.kernels["pid"]) == {p for (p,) in pids} and len(pids) == 2
    joined = tr.kernels.merge(tr.api_calls, on=["pid", "correlation_id"], how="inner")
    assert len(joined) == by_id_pid
    # the launching call lies before the kernel it launched
    assert (joined["start_y"] <= joined["start_x"]).all()


# --------------------------------------------------------------------------- range tree


def _brute_force_parent(r: pd.DataFrame, child_ids: np.ndarray) -> tuple[dict, dict]:
    """Parent and depth of the given ranges by scanning every range of the same thread.

    The parent is the innermost enclosing range on the same pid/tid:
    ``start <= child.start`` and ``end >= child.end``, open at the child's start
    (a range that ended exactly when the child starts is a sibling), the latest
    start winning and, on equal starts, the longer one being the outer one
    (equal intervals: the earlier row is the outer one).
    """
    parent, depth = {}, {}
    groups = {k: g for k, g in r.groupby(["pid", "tid"])}
    for cid in child_ids:
        c = r.loc[cid]
        g = groups[(c["pid"], c["tid"])]
        s, e, ids = g["start"].to_numpy(), g["end"].to_numpy(), g["range_id"].to_numpy()
        before = (s < c["start"]) | (
            (s == c["start"]) & ((e > c["end"]) | ((e == c["end"]) & (ids < cid)))
        )
        enclosing = before & (s <= c["start"]) & (e >= c["end"]) & (c["start"] < e)
        cand = np.flatnonzero(enclosing)
        depth[cid] = len(cand)
        if len(cand) == 0:
            parent[cid] = -1
            continue
        # innermost = last in (start asc, end desc, row asc) order
        best = sorted(cand, key=lambda i: (s[i], -e[i], ids[i]))[-1]
        parent[cid] = int(ids[best])
    return parent, depth


@pytest.mark.parametrize("name, sample", [(NSYS_2024_6, None), (NSYS_2026, 3000)])
def test_range_depth_and_parent_brute_force(name, sample, fixture_file, cached_trace) -> None:
    r = cached_trace(fixture_file(name)).ranges
    assert (r["range_id"].to_numpy() == np.arange(len(r))).all()
    r = r.set_index("range_id", drop=False)
    ids = r["range_id"].to_numpy()
    if sample is not None:
        rng = np.random.default_rng(20240611)
        ids = np.sort(rng.choice(ids, size=sample, replace=False))
    parent, depth = _brute_force_parent(r, ids)
    got_parent = r.loc[ids, "parent_id"].to_numpy()
    got_depth = r.loc[ids, "depth"].to_numpy()
    exp_parent = np.array([parent[i] for i in ids])
    exp_depth = np.array([depth[i] for i in ids])
    bad = np.flatnonzero(got_parent != exp_parent)
    assert len(bad) == 0, r.loc[ids[bad[:5]]]
    assert (got_depth == exp_depth).all()
    assert exp_depth.max() >= 2  # the sample really exercises nesting


def test_range_tree_is_consistent(trace) -> None:
    """Whole-table checks: parent on the same thread, encloses the child, depth = parent + 1."""
    r = trace.ranges
    if r.empty:
        return
    has = r["parent_id"] >= 0
    c = r[has]
    p = r.set_index("range_id").loc[c["parent_id"]]
    assert (p["pid"].to_numpy() == c["pid"].to_numpy()).all()
    assert (p["tid"].to_numpy() == c["tid"].to_numpy()).all()
    assert (p["start"].to_numpy() <= c["start"].to_numpy()).all()
    assert (p["end"].to_numpy() >= c["end"].to_numpy()).all()
    assert (p["depth"].to_numpy() + 1 == c["depth"].to_numpy()).all()
    assert (r.loc[~has, "depth"] == 0).all()


def test_kernel_values_too_wide_to_pack_are_read_unpacked(fixtures_dir, tmp_path):
    """The reader packs kernel columns several to one SQL value; a value beyond its
    bits (a 70,000-block gridY, a 2**40 stream id) must come back exact."""
    from perfguard.trace import load_trace

    path = tmp_path / "wide.sqlite"
    path.write_bytes((fixtures_dir / NSYS_2024_6).read_bytes())
    conn = sqlite3.connect(path)
    rowid = conn.execute("SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    conn.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridY = 70000, streamId = ?,"
        " registersPerThread = 600 WHERE rowid = ?",
        (2**40, rowid),
    )
    conn.commit()
    want = conn.execute(
        "SELECT start, gridX, gridY, gridZ, blockX, blockY, blockZ, registersPerThread, streamId,"
        " deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start"
    ).fetchall()
    conn.close()
    k = load_trace(path).kernels.sort_values("start", kind="stable")
    cols = [
        "start",
        "grid_x",
        "grid_y",
        "grid_z",
        "block_x",
        "block_y",
        "block_z",
        "registers",
        "stream_id",
        "device_id",
    ]
    got = [tuple(int(v) for v in row) for row in k[cols].itertuples(index=False)]
    assert got == [tuple(int(v) for v in row) for row in want]
    assert (70000, 600, 2**40) in {(r[2], r[7], r[8]) for r in got}
