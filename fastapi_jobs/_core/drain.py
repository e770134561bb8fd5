"""Draining the runs in flight when a scheduler stops.

Stop ticking at once; let runs in flight finish up to ``shutdown_timeout``; then
cancel what is left, again and again for a short grace (a job that swallows one
cancellation meets the next at its next await), and log each job cut by name.
"""

from __future__ import annotations

import anyio

from .parts import Parts
from .runner import JobRunner
from .tasks import JobTasks

__all__ = ["drain"]

# After the shutdown deadline: how long runs that ignore cancellation are
# cancelled again, and how often, before the lifespan stops waiting for them.
_GRACE = 5.0
_RECUT = 0.1


async def drain(
    parts: Parts, runners: list[JobRunner], tasks: JobTasks, stopped: anyio.Event
) -> None:
    """Stop every job's task, and wait for (or cut) the runs in flight."""
    logger, timeout = parts.logger, parts.shutdown_timeout
    for runner in runners:
        runner.stop()
    tasks.stop()
    in_flight = [r.job.name for r in runners if r.in_flight]
    if in_flight:
        logger.info(
            "shutting down: waiting up to %s for runs in flight: %s",
            "no limit" if timeout is None else f"{timeout:g}s",
            ", ".join(in_flight),
        )
    with anyio.move_on_after(timeout):
        await stopped.wait()
    for runner in runners:
        if runner.in_flight:
            logger.warning(
                "job %r was still %s at the shutdown deadline (%gs): cancelling it",
                runner.job.name,
                "running" if runner.stats.running else "claiming its tick",
                timeout,
                extra={"job": runner.job.name},
            )
    await _cut(parts, runners, stopped)
    for runner in runners:
        runner.stats.next_run_at = None  # also for jobs that never came due
    threads = [r.job.name for r in runners if r.thread_running]
    if threads:
        logger.warning(
            "shutdown: the thread(s) of job(s) %s are still running and cannot be "
            "interrupted; the process exits when they return, unless a signal's "
            "default action ends it first (uvicorn re-raises SIGTERM, which does)",
            ", ".join(repr(name) for name in threads),
        )


async def _cut(parts: Parts, runners: list[JobRunner], stopped: anyio.Event) -> None:
    """Past the deadline: cancel the runs left again and again for a short grace,
    as anyio's scopes do, then stop waiting for them."""
    with anyio.move_on_after(_GRACE):
        while not stopped.is_set():
            for runner in runners:
                if runner.in_flight:
                    runner.cut()
            with anyio.move_on_after(_RECUT):
                await stopped.wait()
    if not stopped.is_set():
        parts.logger.error(
            "shutdown: job(s) %s ignored cancellation for %gs past the deadline; "
            "the scheduler stops waiting for them",
            ", ".join(repr(r.job.name) for r in runners if r.in_flight),
            _GRACE,
        )
        stopped.set()  # the tasks' owner stops waiting and returns
