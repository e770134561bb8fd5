"""Waiting for what another task, process or the database does in real time: poll
a check until it holds, or fail after a deadline. A fixed sleep counts on the
process not pausing (a garbage collection here takes up to 0.3 s, CI stalls for
longer); a poll does not. `poll` inside an event loop, `wait_until` outside one
(the multi-process tests, the screenshot)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio


async def poll(
    check: Callable[[], bool | Awaitable[bool]], *, within: float = 10.0, every: float = 0.02
) -> None:
    """Until ``check()`` holds, or fail after ``within`` seconds. For what another
    task or the database does in real time: a fixed sleep counts on the process
    not pausing (a garbage collection here takes up to 0.3 s), a poll does not."""
    with anyio.fail_after(within):
        while True:
            held = check()
            if held if isinstance(held, bool) else await held:
                return
            await anyio.sleep(every)


def wait_until(predicate: Callable[[], object], timeout: float = 30, step: float = 0.02) -> None:
    """Until ``predicate()`` is true, blocking; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(step)
