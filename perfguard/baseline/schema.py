"""The SQL schema of the baseline store and the migrations that build it.

A store records ``meta.schema_version``; opening one applies, in order,
every migration above it (a new file starts at 0, so a fresh store is built
by the very same steps an old one is migrated with). Migrations are frozen
once released: a later change to the record columns gets a new migration,
never an edit of an old one, and no migration drops data.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

#: ``meta.format`` and ``PRAGMA application_id`` mark a file as a perfguard store
FORMAT = "perfguard-baseline-store"
APPLICATION_ID = 0x50664764  # "PfGd"

#: the fingerprint fields that runs carries as columns (v2), besides the JSON
FINGERPRINT_COLUMNS = {
    "gpu_name": "TEXT",
    "gpu_count": "INTEGER",
    "driver": "TEXT",
    "cuda": "TEXT",
    "torch": "TEXT",
    "perfguard": "TEXT",
    "backend": "TEXT",
    "host": "TEXT",
    "python": "TEXT",
    "cpu": "TEXT",
}


def _v1_initial(conn: sqlite3.Connection) -> None:
    """v1: runs with the fingerprint as JSON only; tests, samples, op_samples, ops."""
    for sql in (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE runs (
            run_id INTEGER PRIMARY KEY AUTOINCREMENT,
            "commit" TEXT NOT NULL, branch TEXT, dirty INTEGER NOT NULL,
            time TEXT NOT NULL, fingerprint TEXT NOT NULL, perfguard_version TEXT)""",
        """CREATE TABLE tests (
            test_id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            nodeid TEXT NOT NULL, metric TEXT NOT NULL, meta TEXT NOT NULL,
            UNIQUE (run_id, nodeid))""",
        """CREATE TABLE samples (
            test_id INTEGER NOT NULL REFERENCES tests(test_id) ON DELETE CASCADE,
            iteration INTEGER, gpu_time_ns INTEGER, wall_time_ns INTEGER)""",
        """CREATE TABLE op_samples (
            test_id INTEGER NOT NULL REFERENCES tests(test_id) ON DELETE CASCADE,
            op_id TEXT, iteration INTEGER, calls INTEGER,
            gpu_time_ns INTEGER, cpu_time_ns INTEGER)""",
        """CREATE TABLE ops (
            test_id INTEGER NOT NULL REFERENCES tests(test_id) ON DELETE CASCADE,
            op_id TEXT, op_name TEXT, direction TEXT, op_type TEXT, calls INTEGER,
            kernel_count INTEGER, cpu_time_total INTEGER, gpu_time_total INTEGER,
            tc_eligible INTEGER, using_tc INTEGER, tc_utilization REAL, flops REAL,
            bytes INTEGER, flop_efficiency REAL)""",
        "CREATE INDEX tests_run ON tests(run_id)",
        "CREATE INDEX tests_nodeid ON tests(nodeid)",
        "CREATE INDEX samples_test ON samples(test_id)",
        "CREATE INDEX op_samples_test ON op_samples(test_id)",
        "CREATE INDEX ops_test ON ops(test_id)",
    ):
        conn.execute(sql)
    conn.execute("INSERT INTO meta VALUES ('format', ?)", (FORMAT,))


def _v2_fingerprint_columns_and_kernels(conn: sqlite3.Connection) -> None:
    """v2: fingerprint fields as runs columns (filled from the JSON), per-op kernels table."""
    for name, sql_type in FINGERPRINT_COLUMNS.items():
        conn.execute(f'ALTER TABLE runs ADD COLUMN "{name}" {sql_type}')
    sets = ", ".join(
        f"\"{name}\" = json_extract(fingerprint, '$.{name}')" for name in FINGERPRINT_COLUMNS
    )
    conn.execute(f"UPDATE runs SET {sets}")
    conn.execute(
        """CREATE TABLE kernels (
            test_id INTEGER NOT NULL REFERENCES tests(test_id) ON DELETE CASCADE,
            op_id TEXT, op_name TEXT, kernel_name TEXT, calls INTEGER,
            gpu_time_total INTEGER, uses_tc INTEGER)"""
    )
    conn.execute("CREATE INDEX kernels_test ON kernels(test_id)")
    conn.execute('CREATE INDEX runs_commit ON runs("commit")')


def _v3_sample_cpu_time(conn: sqlite3.Connection) -> None:
    """v3: per-iteration thread CPU time (the ``cpu_time`` metric); NULL in older runs."""
    conn.execute("ALTER TABLE samples ADD COLUMN cpu_time_ns INTEGER")


def _v4_rounds_dtypes_counters(conn: sqlite3.Connection) -> None:
    """v4: the round of each sample (0 in older runs: one round), an op's input dtypes,
    and the deterministic counters the gates compare."""
    conn.execute("ALTER TABLE samples ADD COLUMN round INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE ops ADD COLUMN dtypes TEXT")
    conn.execute(
        """CREATE TABLE counters (
            test_id INTEGER NOT NULL REFERENCES tests(test_id) ON DELETE CASCADE,
            op_id TEXT, op_name TEXT, counter TEXT, value REAL, stable INTEGER)"""
    )
    conn.execute("CREATE INDEX counters_test ON counters(test_id)")


#: (version reached, migration), in order
MIGRATIONS: tuple[tuple[int, Callable[[sqlite3.Connection], None]], ...] = (
    (1, _v1_initial),
    (2, _v2_fingerprint_columns_and_kernels),
    (3, _v3_sample_cpu_time),
    (4, _v4_rounds_dtypes_counters),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]
