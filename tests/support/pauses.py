"""Run pytest while its processes are stopped now and then: ``python -m tests.pauses
[--pause 0.3] [pytest arguments]``.

A test that counts on real time passing evenly (a fixed sleep, a short store
timeout) passes on a quiet machine and fails in CI, where the process stalls:
a full garbage collection, a busy neighbour, a virtual machine's stolen CPU.
This stops every pytest process (SIGSTOP, SIGCONT) for ``--pause`` seconds at
random intervals of ``--every`` (a range), so such tests fail here, now, and
say which margin was too small. The database servers and the uvicorn processes
the tests start are not paused: only the processes that wait on them.

"Every pytest process" is the main one and, under pytest-xdist, each worker,
which is where the tests run. Each one names itself: this module is also a
pytest plugin (``-p tests.support.pauses``, added here) that, in every process where
pytest starts, leaves a file named by its pid in the folder given by
``FASTAPI_JOBS_PAUSES``. The processes the tests start do not load pytest, so
they never appear there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ENV = "FASTAPI_JOBS_PAUSES"


def _started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), to tell it from a later
    process given the same pid; None where it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def pytest_configure(config: pytest.Config) -> None:
    folder = os.environ.get(ENV)
    if folder:
        # Written whole, then named: the pauser never reads half a file.
        pid = os.getpid()
        Path(folder, f"{pid}.new").write_text(_started(pid) or "")
        os.replace(Path(folder, f"{pid}.new"), Path(folder, str(pid)))


def _pytest_processes(folder: Path) -> list[int]:
    """The pids that named themselves and are still the processes that did."""
    pids = []
    for entry in folder.iterdir():
        if not entry.name.isdigit():
            continue  # still being written
        pid = int(entry.name)
        if _started(pid) == entry.read_text():
            pids.append(pid)
        else:
            entry.unlink(missing_ok=True)  # ended
    return pids


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, sig)


def pause_now_and_then(
    folder: Path, pause: float, every: tuple[float, float], done: threading.Event
) -> int:
    """Stop every pytest process named in ``folder`` for ``pause`` seconds at
    random intervals until ``done``; how many times."""
    stops = 0
    while not done.wait(random.uniform(*every)):
        pids = _pytest_processes(folder)
        try:
            _signal(pids, signal.SIGSTOP)
            done.wait(pause)
        finally:
            _signal(pids, signal.SIGCONT)
        stops += 1
    return stops


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.pauses", description=__doc__)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds stopped (0.3)")
    parser.add_argument(
        "--every",
        type=float,
        nargs=2,
        default=(1.5, 4.0),
        metavar=("MIN", "MAX"),
        help="seconds between stops, drawn at random (1.5 4)",
    )
    options, pytest_args = parser.parse_known_args()
    lo, hi = options.every
    with tempfile.TemporaryDirectory(prefix="fastapi_jobs_pauses_") as folder:
        tests = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "tests.support.pauses", *pytest_args],
            env={**os.environ, ENV: folder},
        )
        done = threading.Event()
        stops: list[int] = []
        pauser = threading.Thread(
            target=lambda: stops.append(
                pause_now_and_then(Path(folder), options.pause, (lo, hi), done)
            )
        )
        pauser.start()
        try:
            code = tests.wait()
        finally:
            done.set()
            pauser.join()
    print(f"tests.pauses: stopped the pytest processes {sum(stops)} times for {options.pause:g} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
