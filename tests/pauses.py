"""Run pytest while its process is stopped now and then: ``python -m tests.pauses
[--pause 0.3] [pytest arguments]``.

A test that counts on real time passing evenly (a fixed sleep, a short store
timeout) passes on a quiet machine and fails in CI, where the process stalls:
a full garbage collection, a busy neighbour, a virtual machine's stolen CPU.
This stops the pytest process (SIGSTOP, SIGCONT) for ``--pause`` seconds at
random intervals of ``--every`` (a range), so such tests fail here, now, and
say which margin was too small. The database servers and the uvicorn processes
the tests start are not paused: only the process that waits on them.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading


def pause_now_and_then(
    pid: int, pause: float, every: tuple[float, float], done: threading.Event
) -> int:
    """Stop ``pid`` for ``pause`` seconds at random intervals until ``done``."""
    stops = 0
    while not done.wait(random.uniform(*every)):
        try:
            os.kill(pid, signal.SIGSTOP)
            done.wait(pause)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                break
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
    tests = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args])
    done = threading.Event()
    stops: list[int] = []
    pauser = threading.Thread(
        target=lambda: stops.append(pause_now_and_then(tests.pid, options.pause, (lo, hi), done))
    )
    pauser.start()
    try:
        code = tests.wait()
    finally:
        done.set()
        pauser.join()
    print(f"tests.pauses: stopped pytest {sum(stops)} times for {options.pause:g} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
