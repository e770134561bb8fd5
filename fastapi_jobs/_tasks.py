"""Where the jobs' tasks live: one task per job, all held by one owner task.

A job's task is made when the job first comes due (or at start, for a job that
must ask the store about missed ticks first), and then parks between runs
until the scheduler stops: an hourly job costs no task and no memory beyond its
place in the dispatcher's buckets until its first tick.

The owner is a single task of the scheduler's anyio task group, and it does
not return before every job's task has ended, so none outlives the lifespan;
the one exception is a task whose job ignores cancellation past the shutdown
grace, which on asyncio the scheduler stops waiting for (see
``Scheduler._drain``). On asyncio the jobs' tasks are plain asyncio tasks: an
anyio task costs ~60 µs and ~3 KiB more per job to start (its own cancel scope,
event and wrapper coroutine). Elsewhere (trio) each is an anyio task in its own
scope.

Every job's task starts from a copy of the scheduler's own context, taken when
it starts: a task copies the context of whoever makes it, and the first to wake
a job may be a request (a trigger), whose context variables (and tracing span)
would otherwise live on in every later run of the job.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from ._runner import Dispatching, JobRunner

__all__ = ["JobTasks"]

# Cancelled with the owner, tasks that do not end within this are left behind.
_ABANDON_AFTER = 5.0


class JobTasks:
    """Makes each job's task, and owns them all (:meth:`run`)."""

    def __init__(
        self, state: Mapping[str, Any], dispatcher: Dispatching, all_ended: anyio.Event
    ) -> None:
        self._state = state
        self._dispatcher = dispatcher
        self._all_ended = all_ended
        """Set once stopping and every task has ended; whoever sets it first
        (the scheduler, to stop waiting for jobs that ignore cancellation)
        makes :meth:`run` return."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._spawned: list[JobRunner] = []  # their tasks, if the owner must cancel them
        self._live = 0
        self._stopping = False
        self._failed: BaseException | None = None
        self._pending: list[JobRunner] = []  # asked for before the owner ran
        self._context = contextvars.copy_context()

    def spawn(self, runner: JobRunner) -> None:
        """Make ``runner``'s task (once; it serves until the scheduler stops)."""
        if self._stopping:
            return  # runners do not ask once stopping; never a task past the owner
        self._live += 1
        loop, tg = self._loop, self._tg
        if loop is not None:
            task = loop.create_task(
                runner.serve(self._state, self._dispatcher),
                name=f"fastapi_jobs:{runner.job.name}",
                context=self._context.copy(),
            )
            runner.bind(task.cancel, task)
            self._spawned.append(runner)
            task.add_done_callback(self._ended)
        elif tg is not None:
            # The new task copies the context it is started from: this one.
            self._context.copy().run(tg.start_soon, self._serve_in_scope, runner)
        else:
            self._live -= 1
            self._pending.append(runner)

    def stop(self) -> None:
        """No more tasks will be made: :meth:`run` returns once the last one ends."""
        self._stopping = True
        if self._live == 0:
            self._all_ended.set()

    async def run(self) -> None:
        """The owner: holds the tasks until they have all ended after :meth:`stop`."""
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._spawn_pending()
                await self._all_ended.wait()
            return
        self._spawn_pending()
        try:
            await self._all_ended.wait()
        except BaseException:
            # The owner itself is cancelled: take the tasks along.
            tasks = (runner.task for runner in self._spawned)
            pending = [task for task in tasks if task is not None and not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(pending, timeout=_ABANDON_AFTER)
            raise
        finally:
            self._loop = None
        if self._failed is not None:
            raise self._failed  # a bug in a job's task: surface it

    def _spawn_pending(self) -> None:
        pending, self._pending = self._pending, []
        for runner in pending:
            self.spawn(runner)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._failed is None:
            self._failed = task.exception()
        self._one_ended()

    def _one_ended(self) -> None:
        self._live -= 1
        if self._live == 0 and self._stopping:
            self._all_ended.set()

    async def _serve_in_scope(self, runner: JobRunner) -> None:
        try:
            with anyio.CancelScope() as scope:
                runner.bind(scope.cancel, None)
                await runner.serve(self._state, self._dispatcher)
        finally:
            self._one_ended()
