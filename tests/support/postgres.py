"""A real PostgreSQL server for the tests (and the benchmark), started on demand.

Uses the PostgreSQL 15 binaries of the machine. ``initdb`` refuses to run as
root, so as root the server runs as the ``postgres`` user. Data lives in a
temporary directory; fsync is off (the tests do not survive power loss).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .ports import free_port

BIN_DIRS = [
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/17/bin",
]


def find_bin() -> Path | None:
    for d in BIN_DIRS:
        if (Path(d) / "initdb").exists():
            return Path(d)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def find_faketime() -> Path | None:
    """libfaketime (Debian's ``faketime``), which `PostgresServer` preloads to
    step the server's clock."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    return found[0] if found else None


class PostgresServer:
    """One throwaway cluster: start(), stop(), restart(), and fresh databases.

    ``steppable``: the server's clock can be stepped (`step_clock`), as an
    operator's ``date -s`` or NTP would step the database host's: the server
    runs under libfaketime, which reads the offset from a file at every reading
    of the clock (the monotonic clock is left alone)."""

    def __init__(self, *, steppable: bool = False) -> None:
        bindir = find_bin()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server binaries (initdb) on this machine")
        self.bin = bindir
        self.root = Path(tempfile.mkdtemp(prefix="fastapi_jobs_pg_"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._counter = 0
        self.env: dict[str, str] | None = None
        self._clock_offset = 0
        if steppable:
            library = find_faketime()
            if library is None:
                raise RuntimeError("no libfaketime here (Debian's faketime package)")
            clock = self.root / "clock"
            clock.write_text("+0\n")
            clock.chmod(0o644)
            self.env = {
                **os.environ,
                "LD_PRELOAD": str(library),
                "FAKETIME_TIMESTAMP_FILE": str(clock),
                "FAKETIME_NO_CACHE": "1",
                "DONT_FAKE_MONOTONIC": "1",
            }
        self.psql_bin = str(self.bin / "psql") if (self.bin / "psql").exists() else "psql"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin / tool), *args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        env = self.env if tool == "pg_ctl" else None
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

    def step_clock(self, seconds: int) -> None:
        """Step the server's clock by ``seconds`` (a ``steppable`` server's):
        every reading of it from now on, in every backend."""
        assert self.env is not None, "a steppable server's"
        self._clock_offset += seconds
        tmp = self.root / "clock.new"
        tmp.write_text(f"{self._clock_offset:+d}\n")
        tmp.chmod(0o644)
        tmp.replace(self.root / "clock")  # whole: a backend never reads half a file

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=300"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def url(self, database: str = "postgres", driver: str = "asyncpg") -> str:
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its name."""
        self._counter += 1
        name = f"t{os.getpid()}_{self._counter}"
        self.psql(f"CREATE DATABASE {name}")
        return name

    def psql(self, sql: str, database: str = "postgres") -> str:
        out = subprocess.run(
            [
                self.psql_bin,
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-At",
                "-c",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
