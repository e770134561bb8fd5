"""Declaring jobs: what ``add_job``, ``every``, ``cron`` and ``add_observer`` do.

The options themselves are one ``TypedDict`` (`fastapi_jobs._job.JobOptions`),
checked by ``Job.build``; here are the rules a job must keep among the others of
its scheduler (a unique name, a store for ``catch_up=``), and its runner made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .._errors import ConfigurationError, short
from .._job import Job, JobOptions
from .._schedules import Schedule
from .parts import Parts
from .runner import JobRunner

__all__ = ["RESERVED", "add_job", "add_observer", "add_observers", "check_catch_up"]

RESERVED = ("instances", "schedules", "ui")
"""Names the routes under ``/jobs`` take (``GET /jobs/instances``, ``/jobs/schedules``,
the page ``/jobs/ui``): no job may have them, or its status would be out of reach."""


def check_catch_up(job: Job, store: object) -> None:
    """`ConfigurationError` for a catch-up that nothing can remember (a declared
    job's, or a stored schedule's)."""
    if job.catch_up is not None and (store is None or job.every_instance):
        raise ConfigurationError(
            f"job {job.name!r}: catch_up= needs the store to remember the last tick "
            "across restarts: pass Scheduler(store=...), and do not combine it "
            "with every_instance=True"
        )


def add_job(
    parts: Parts,
    func: Callable[..., Any],
    schedule: Schedule,
    options: JobOptions,
    *,
    running: bool,
    where: str = "add_job",
) -> Job:
    """Check and register a job (``running``: the scheduler is, and refuses it)."""
    if running:
        name = options.get("name")
        raise ConfigurationError(
            f"cannot add job {name or getattr(func, '__name__', func)!r}: the "
            "scheduler is already running; declare jobs before the app starts"
        )
    # A store may keep an outbox (a record of the ticks handed off to queues).
    # The outbox of the store the scheduler has when a run goes (a test may give
    # it another for a while: testing.virtual), not the one it had here.
    job = Job.build(func, schedule, options, where=where, outbox=lambda: parts.capabilities.outbox)
    if job.name in parts.runners:
        raise ConfigurationError(f"job {job.name!r} is declared twice: give one of them name=")
    if job.name in RESERVED:
        raise ConfigurationError(
            f"the job name {job.name!r} is taken by the route GET /jobs/{job.name}: choose "
            "another name="
        )
    check_catch_up(job, parts.store)
    parts.runners[job.name] = JobRunner(
        job, parts.ticking, parts.logger, parts.leases, parts.history, parts.observers
    )
    return job


def add_observers(parts: Parts, observers: object) -> None:
    """``Scheduler(observers=)``: a list of them, each added."""
    if isinstance(observers, (str, bytes)) or not isinstance(observers, Iterable):
        raise ConfigurationError(
            f"Scheduler(observers={short(observers)}): pass a list of observers, "
            "e.g. observers=[MyObserver()]"
        )
    for observer in observers:
        parts.observers.add(observer)


def add_observer(parts: Parts, observer: object) -> None:
    """Tell ``observer`` about every run and skipped tick of every job from now on."""
    parts.observers.add(observer)
    for runner in parts.runners.values():
        runner.watched_by(parts.observers)
