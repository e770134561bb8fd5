"""Where the jobs' tasks live: one task per job, all held by one owner task.

The owner is a single task of the scheduler's anyio task group, and it does
not return before every loop has ended, so no loop outlives the lifespan; the
one exception is a loop whose job ignores cancellation past the shutdown grace,
which on asyncio the scheduler stops waiting for (see ``Scheduler._drain``).
On asyncio the loops are plain asyncio tasks: an anyio task costs ~60 µs and
~3 KiB more per job to start (its own cancel scope, event and wrapper
coroutine), which with thousands of jobs is most of the cost of starting and
of every tick. Elsewhere (trio) each loop is an anyio task in its own scope.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from ._runner import Dispatching, JobRunner

__all__ = ["run_loops"]

# Cancelled with the owner, loops that do not end within this are left behind.
_ABANDON_AFTER = 5.0


async def run_loops(
    runners: list[JobRunner],
    state: Mapping[str, Any],
    dispatcher: Dispatching,
    all_ended: anyio.Event,
) -> None:
    """Run each runner's task until it ends; set ``all_ended`` when the last does.

    On asyncio, whoever sets ``all_ended`` first makes this return: the
    scheduler does so to stop waiting for loops that ignore cancellation.
    """
    remaining = len(runners)

    def ended(_: object = None) -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0:
            all_ended.set()

    if not runners:
        all_ended.set()
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        await _run_as_anyio_tasks(runners, state, dispatcher, ended)
    else:
        await _run_as_asyncio_tasks(loop, runners, state, dispatcher, ended, all_ended)


async def _run_as_asyncio_tasks(
    loop: asyncio.AbstractEventLoop,
    runners: list[JobRunner],
    state: Mapping[str, Any],
    dispatcher: Dispatching,
    ended: Callable[[object], None],
    all_ended: anyio.Event,
) -> None:
    tasks = []
    for runner in runners:
        task = loop.create_task(
            runner.serve(state, dispatcher), name=f"fastapi_jobs:{runner.job.name}"
        )
        runner.bind(task.cancel, task)
        task.add_done_callback(ended)
        tasks.append(task)
    try:
        await all_ended.wait()
    except BaseException:
        # The owner itself is cancelled: take the loops along.
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(pending, timeout=_ABANDON_AFTER)
        raise
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # a bug in a job's task: surface it


async def _run_as_anyio_tasks(
    runners: list[JobRunner],
    state: Mapping[str, Any],
    dispatcher: Dispatching,
    ended: Callable[[object], None],
) -> None:
    async def run(runner: JobRunner) -> None:
        try:
            with anyio.CancelScope() as scope:
                runner.bind(scope.cancel, None)
                await runner.serve(state, dispatcher)
        finally:
            ended(None)

    async with anyio.create_task_group() as tg:
        for runner in runners:
            tg.start_soon(run, runner)
