"""A writer of small nsys SQLite exports for hand-computed test cases.

The tables are created with the exact ``CREATE TABLE`` statements of a real
export (a shared fixture), and its ``META_DATA_EXPORT`` and
``TARGET_INFO_GPU`` rows are copied, so the reader sees the real schema,
version and GPU; only the events are written here. Columns the builder does
not set get the export's defaults: 0 for ``NOT NULL`` columns, NULL
otherwise.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

#: the export whose schema and GPU (an H200, nsys 2024.6.2) the built files take
TEMPLATE = "nsys/nsys2024.6.2_nvfuser-matmul-gtest_nvtx_h200.sqlite"
_TABLES = (
    "StringIds",
    "NVTX_EVENTS",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "TARGET_INFO_GPU",
    "META_DATA_EXPORT",
    "ThreadNames",
)
NVTX_PUSH_POP = 59
RUNTIME_EVENT_CLASS = 1


def global_tid(pid: int, tid: int) -> int:
    """nsys' serialized GlobalId: VM id 1, pid and tid in 24-bit fields."""
    return (1 << 48) | (pid << 24) | tid


class NsysBuilder:
    """Events of one process on the template's GPU (device 0)."""

    def __init__(self, template: Path, dest: Path, pid: int = 4242) -> None:
        self.dest, self.pid = dest, pid
        src = sqlite3.connect(f"file:{template}?mode=ro", uri=True)
        self.con = sqlite3.connect(dest)
        for table in _TABLES:
            (sql,) = src.execute(
                "SELECT sql FROM sqlite_master WHERE name = ?", (table,)
            ).fetchone()
            self.con.execute(sql)
        for table in ("META_DATA_EXPORT", "TARGET_INFO_GPU"):
            rows = src.execute(f"SELECT * FROM {table}").fetchall()
            marks = ",".join("?" * len(rows[0]))
            self.con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        src.close()
        self.strings: dict[str, int] = {}
        self.corr = 0

    def string(self, text: str) -> int:
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
            self.con.execute("INSERT INTO StringIds VALUES (?, ?)", (self.strings[text], text))
        return self.strings[text]

    def _insert(self, table: str, values: dict) -> None:
        cols = self.con.execute(f"PRAGMA table_info({table})").fetchall()
        row = {name: (0 if notnull else None) for _, name, _, notnull, _, _ in cols}
        row.update(values)
        names = ",".join(row)
        self.con.execute(
            f"INSERT INTO {table} ({names}) VALUES ({','.join('?' * len(row))})", list(row.values())
        )

    def thread(self, tid: int, name: str) -> None:
        self._insert(
            "ThreadNames", {"nameId": self.string(name), "globalTid": global_tid(self.pid, tid)}
        )

    def range(self, start: int, end: int, text: str, tid: int) -> None:
        """An NVTX push/pop range with its text inline (as ``torch.cuda.nvtx`` writes it)."""
        self._insert(
            "NVTX_EVENTS",
            {
                "start": start,
                "end": end,
                "eventType": NVTX_PUSH_POP,
                "text": text,
                "globalTid": global_tid(self.pid, tid),
            },
        )

    def launch(
        self,
        call: tuple[int, int],
        gpu: tuple[int, int],
        kernel: str,
        tid: int,
        stream: int = 7,
        grid: tuple[int, int, int] = (1, 1, 1),
        block: tuple[int, int, int] = (128, 1, 1),
    ) -> None:
        """A ``cudaLaunchKernel`` call on ``tid`` and the kernel it launched."""
        self.corr += 1
        self._insert(
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            {
                "start": call[0],
                "end": call[1],
                "eventClass": RUNTIME_EVENT_CLASS,
                "globalTid": global_tid(self.pid, tid),
                "correlationId": self.corr,
                "nameId": self.string("cudaLaunchKernel_v7000"),
            },
        )
        short = kernel.split("<")[0].split("(")[0].removeprefix("void ")
        self._insert(
            "CUPTI_ACTIVITY_KIND_KERNEL",
            {
                "start": gpu[0],
                "end": gpu[1],
                "deviceId": 0,
                "contextId": 1,
                "streamId": stream,
                "correlationId": self.corr,
                "globalPid": global_tid(self.pid, 0),
                "demangledName": self.string(kernel),
                "shortName": self.string(short),
                "gridX": grid[0],
                "gridY": grid[1],
                "gridZ": grid[2],
                "blockX": block[0],
                "blockY": block[1],
                "blockZ": block[2],
            },
        )

    def close(self) -> Path:
        self.con.commit()
        self.con.close()
        return self.dest
