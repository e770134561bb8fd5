"""A real Redis server for the tests, started on demand (Debian's ``redis-server``).

It listens on a unix socket in a temporary directory, with no TCP port and no
persistence: what the hand-off tests need is Redis's own refusal of a duplicate
job id, and a server they can stop (SIGSTOP: alive, not answering) and resume.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

SERVER = "/usr/bin/redis-server"


class RedisServer:
    """One throwaway server: start(), freeze()/thaw(), destroy()."""

    def __init__(self) -> None:
        found = SERVER if Path(SERVER).exists() else shutil.which("redis-server")
        if found is None:
            raise RuntimeError(
                "no redis-server on this machine (Debian: apt-get install redis-server)"
            )
        self.bin = found
        self.root = Path(tempfile.mkdtemp(prefix="fastapi_jobs_redis_"))
        self.socket = self.root / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.bin,
                "--port",
                "0",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
                "--logfile",
                str(self.root / "log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # it logs to its logfile
        )
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited {self.proc.returncode} (see {self.root}/log)"
                )
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server made no socket within 10 s")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def freeze(self) -> None:
        """Stop the server's process: connections stay open, nothing answers."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def destroy(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
