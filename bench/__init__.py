"""Benchmarks: fastapi_jobs side by side with the asyncio floor and its peers.

Run ``python -m bench`` (see ``bench/__main__.py``); its tables go to BENCHMARKS.md,
which holds nothing else; the notes written by hand are docs/development/benchmark-notes.md.
"""

from __future__ import annotations

import time

__all__ = ["wait_for"]


def wait_for(port: int, within: float = 300.0) -> None:
    """Until the app on ``port`` answers ``GET /ping`` (a loaded machine starts
    it in seconds, not in a fixed time), for ``within`` seconds at most."""
    import httpx

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server on port {port} did not start within {within:.0f} s")
