"""Real app processes (uvicorn) sharing one database, for the multi-instance tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from .ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def sync_url(url: str) -> str:
    """The same database through a sync driver, for the test's own reads."""
    return url.replace("+aiosqlite", "").replace("postgresql+asyncpg", "postgresql+psycopg")


class App:
    """One uvicorn process running tests/apps/cluster_app.py (or ``app``)."""

    def __init__(
        self, url: str, *, workers: int = 1, app: str = "tests.apps.cluster_app:app", **env: object
    ) -> None:
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            mode="w+", prefix="cluster_app_", suffix=".log", delete=False
        )
        self.workers = workers
        # Several workers share one port, which must be known before they start.
        self.port = 0 if workers == 1 else free_port()
        port = str(self.port)
        command = [sys.executable, "-m", "uvicorn", app, "--port", port]
        if workers > 1:
            command += ["--workers", str(workers)]
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": url, **{k: str(v) for k, v in env.items()}},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own: stop() ends its workers too
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return Path(self.log.name).read_text()

    @property
    def base_url(self) -> str:
        """Where the app listens (uvicorn logs the port it was given)."""
        found = re.search(r"Uvicorn running on (http://[\d.]+:\d+)", self.output())
        assert found, self.output()
        return found.group(1)

    def ready(self) -> bool:
        """Every worker started and the port bound. uvicorn logs startup complete
        before it binds and says where it listens; ``base_url`` needs the latter."""
        output = self.output()
        return (
            output.count("Application startup complete") >= self.workers
            and "Uvicorn running on" in output
        )

    def wait_started(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"app did not start:\n{self.output()}")
            time.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def terminate(self, timeout: float = 30) -> None:
        """Graceful stop (SIGTERM), waiting for the process to end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Kill the process and its workers (its own process group)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers left behind, if any
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def start(url: str, count: int, **env: object) -> list[App]:
    apps = [App(url, **env) for _ in range(count)]  # type: ignore[arg-type]
    try:
        for app in apps:
            app.wait_started()
    except BaseException:
        for app in apps:  # nobody else holds them yet: do not leak processes or logs
            app.stop()
        raise
    return apps


def rows(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(sync_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        engine.dispose()
