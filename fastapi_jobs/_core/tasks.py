"""Where the jobs' tasks live: one task per job, all held by one owner task.

A job's task is made when the job first comes due (or at start, for a job that
must ask the store about missed ticks first), and then parks between runs
until the scheduler stops: an hourly job costs no task and no memory beyond its
place in the dispatcher's buckets until its first tick.

The owner is a single task of the scheduler's anyio task group, and it does
not return before every job's task has ended, so none outlives the lifespan;
the one exception is a task whose job ignores cancellation past the shutdown
grace, which on asyncio the scheduler stops waiting for (see
``Scheduler._drain``). How a task is made and held is the running library's
(``_core.concurrency``: plain asyncio tasks on asyncio, anyio tasks in their own
scopes elsewhere).

Every job's task starts from a copy of the scheduler's own context, taken when
it starts: a task copies the context of whoever makes it, and the first to wake
a job may be a request (a trigger), whose context variables (and tracing span)
would otherwise live on in every later run of the job.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any

import anyio

from .concurrency import Backend, backend
from .runner import Dispatching, JobRunner

__all__ = ["JobTasks"]


class JobTasks:
    """Makes each job's task, and owns them all (`run`)."""

    def __init__(
        self, state: Mapping[str, Any], dispatcher: Dispatching, all_ended: anyio.Event
    ) -> None:
        self.state = state
        """What the jobs' runs are given (the app's lifespan state)."""
        self.dispatcher = dispatcher
        self._all_ended = all_ended
        """Set once stopping and every task has ended; whoever sets it first
        (the scheduler, to stop waiting for jobs that ignore cancellation)
        makes `run` return."""
        self._backend: Backend | None = None  # chosen when the owner runs
        self._live = 0
        self._stopping = False
        self._failed: BaseException | None = None
        self._pending: list[JobRunner] = []  # asked for before the owner ran
        self._context = contextvars.copy_context()

    def spawn(self, runner: JobRunner) -> None:
        """Make ``runner``'s task (once; it serves until the scheduler stops)."""
        if self._stopping:
            return  # runners do not ask once stopping; never a task past the owner
        backend = self._backend
        if backend is None:
            self._pending.append(runner)
            return
        self._live += 1
        backend.start(
            runner,
            runner.serve,
            runner.job.name,
            self._context.copy(),
            self._ended,
        )

    def stop(self) -> None:
        """No more tasks will be made: `run` returns once the last one ends."""
        self._stopping = True
        if self._live == 0:
            self._all_ended.set()

    async def run(self) -> None:
        """The owner: holds the tasks until they have all ended after `stop`."""
        self._backend = backend()
        try:
            await self._backend.hold(self._all_ended, self._spawn_pending)
        finally:
            self._backend = None
        if self._failed is not None:
            raise self._failed  # a bug in a job's task: surface it

    def _spawn_pending(self) -> None:
        pending, self._pending = self._pending, []
        for runner in pending:
            self.spawn(runner)

    def _ended(self, failure: BaseException | None) -> None:
        if failure is not None and self._failed is None:
            self._failed = failure
        self._live -= 1
        if self._live == 0 and self._stopping:
            self._all_ended.set()
