"""A real PgBouncer (Debian's package) in front of the tests' PostgreSQL server.

Managed PostgreSQL is often reached through a pooler in transaction mode: each
transaction (each statement, outside one) may run on another server
connection, shared with other clients. The pooler tests put one in between.
PgBouncer refuses to run as root, so as root it runs as the ``postgres`` user,
like the server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .ports import free_port
from .postgres import PostgresServer

BINARY = "/usr/sbin/pgbouncer"


class PgBouncer:
    """One PgBouncer for ``server`` in ``mode`` (transaction, session or statement)."""

    def __init__(self, server: PostgresServer, mode: str = "transaction") -> None:
        found = BINARY if Path(BINARY).exists() else shutil.which("pgbouncer")
        if found is None:
            raise RuntimeError("no pgbouncer on this machine (Debian: apt-get install pgbouncer)")
        self.bin = found
        self.server = server
        self.mode = mode
        self.root = Path(tempfile.mkdtemp(prefix="fastapi_jobs_pgbouncer_"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        (self.root / "users.txt").write_text('"postgres" ""\n')
        # Few server connections for many clients: what a pooler is for, and
        # what makes two clients' statements meet on one server connection.
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = trust\n"
            f"auth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = {mode}\n"
            "default_pool_size = 4\nmax_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.root / 'log'}\n"
        )
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            for path in self.root.iterdir():
                shutil.chown(path, "postgres", "postgres")

    def start(self) -> None:
        cmd = [self.bin, str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # It logs to its logfile (what a failure to start shows).
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            if self.proc.poll() is not None:
                log = self.root / "log"
                said = log.read_text() if log.exists() else ""
                raise RuntimeError(f"pgbouncer exited {self.proc.returncode}: {said}")
            if time.monotonic() > deadline:
                raise RuntimeError("pgbouncer did not listen within 10 s")
            time.sleep(0.02)

    def url(self, database: str, driver: str = "asyncpg") -> str:
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def destroy(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # runuser passes the signal on to pgbouncer.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
