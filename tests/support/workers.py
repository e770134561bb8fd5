"""Queue worker processes for the hand-off tests (arq, Celery, procrastinate):
started with their output in a log file, stopped whatever state they are in."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def spawn(args: Sequence[str], cwd: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``python -m <args>`` in ``cwd``, unbuffered, its output in ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
