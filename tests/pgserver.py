"""A throwaway PostgreSQL server for the tests and benchmarks: its own cluster in a temp dir.

``initdb`` and ``pg_ctl`` from Debian's ``postgresql`` package (or any on
PATH); the server listens only on a Unix socket in the cluster's folder, so
several test sessions (xdist workers, other checkouts) never collide. initdb
refuses to run as root, so as root the cluster belongs to the ``postgres``
user and the commands run through ``runuser``. :func:`find_binaries` gives
None (the reason in :data:`WHY_NOT`) where there is no server to start.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

WHY_NOT: list[str] = []


def find_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl, or None (and the reason in WHY_NOT)."""
    WHY_NOT.clear()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        WHY_NOT.append("psycopg is not installed (pip install 'perfguard[postgresql]')")
        return None
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).parent] if on_path else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            if os.geteuid() == 0 and not _user_exists("postgres"):
                WHY_NOT.append("running as root and there is no postgres user to run the server")
                return None
            return folder
    WHY_NOT.append("PostgreSQL is not installed (apt-get install postgresql)")
    return None


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


class PgServer:
    """One cluster: ``start()``, ``new_database()`` (a URL), ``stop()``."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="perfguard-pg-"))
        self.data = self.root / "data"
        self.as_root = os.geteuid() == 0
        self.user = "postgres" if self.as_root else pwd.getpwuid(os.geteuid()).pw_name
        if self.as_root:  # the server's user must reach its folder and own its data
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr.strip()[-2000:]}")

    def start(self) -> PgServer:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        opts = (
            f"-c listen_addresses='' -c unix_socket_directories='{self.root}' "
            "-c fsync=off -c max_connections=200 -c shared_buffers=32MB"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            opts,
            "-w",
            "-t",
            "60",
            "-l",
            str(self.root / "server.log"),
            "start",
        )
        return self

    def url(self, dbname: str = "postgres", user: str | None = None) -> str:
        return f"postgresql://{user or self.user}@/{dbname}?host={self.root}"

    def admin(self, sql: str, dbname: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            conn.execute(sql)

    def new_database(self) -> str:
        """A URL of a new, empty database."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.admin(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
