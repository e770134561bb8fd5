"""What a scheduler is made of: the parts fixed when it is built, which its
declaring, running, operating and reading sides (and the integrations' seam)
share.

One object holds them, so that each side takes what it needs from one place and
none of them holds the ``Scheduler`` itself. ``check_parts`` refuses, with what to
do, the parts a ``Scheduler()`` cannot work with.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from .._checks import is_whole
from .._clock import Clock, OffsetClock
from .._errors import ConfigurationError, JobNotFoundError, short
from .._store import Capabilities, Instance, Store, missing
from .heartbeat import Heartbeat
from .leases import LeaseKeeper
from .observers import Observers
from .runner import JobRunner

__all__ = [
    "AppLifespan",
    "Leaving",
    "Parts",
    "Service",
    "check_history",
    "check_parts",
    "connect",
]

AppLifespan = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]
"""The app's own lifespan: ``app -> async context manager`` yielding its state."""

Service = tuple[str, Callable[[], Awaitable[None]]]
"""A task that lives as long as the jobs run (the metrics' cluster reads), by name."""

Leaving = Callable[[JobRunner], None]
"""Told of a runner that leaves the scheduler, its counts with it (the metrics keep them)."""


@dataclass(eq=False, slots=True)
class Parts:
    """A scheduler's parts, and its jobs' runners by name (in declaration order)."""

    logger: logging.Logger
    clock: Clock
    """Where time comes from (``Scheduler(clock=)``): a run by hand's tick."""
    ticking: Clock
    """Jobs tick on this clock: with a store, shifted onto the database's."""
    store: Store | None
    capabilities: Capabilities
    """What ``store`` can do beyond `Store`, read once (`Capabilities.of`)."""
    instance: Instance
    observers: Observers
    leases: LeaseKeeper | None
    history: int
    shutdown_timeout: float | None
    app_lifespan: AppLifespan | None
    heartbeat: Heartbeat | None = None
    runners: dict[str, JobRunner] = field(default_factory=dict)
    services: list[Service] = field(default_factory=list)
    leaving: list[Leaving] = field(default_factory=list)
    """Told of each runner taken out of ``runners`` for good: its stored schedule
    removed or left alone here (not a change of schedule: its successor takes
    over its stats)."""
    versions: dict[str, int] = field(default_factory=dict)
    """The schedules made at run time that run here, and the version of each
    (``_dynamic.book``): their claims name it."""

    def runner(self, name: str) -> JobRunner:
        """The runner of job ``name``; `JobNotFoundError` if none is declared."""
        try:
            return self.runners[name]
        except KeyError:
            raise JobNotFoundError(name, list(self.runners)) from None


def connect(
    parts: Parts,
    clock: Clock,
    store: Store | None,
    on_pauses: Callable[[Mapping[str, tuple[float, int]]], None],
    reads: Sequence[tuple[str, Callable[[], Awaitable[None]]]],
) -> None:
    """Give ``parts`` their clock and store, and what follows from them: the
    clock jobs tick on (with a store, shifted onto the database's), what the
    store can do, the leases' keeper and the heartbeat (which gives the pauses
    it reads to ``on_pauses``, and makes ``reads`` after each beat). Every
    declared job's runner takes them too: a scheduler built with one clock and
    store runs a test on others (``fastapi_jobs.testing.virtual``)."""
    on_db_time = None if store is None else OffsetClock(clock)
    parts.clock, parts.store = clock, store
    parts.ticking = clock if on_db_time is None else on_db_time
    parts.capabilities = Capabilities.of(store)
    parts.leases = None if store is None else LeaseKeeper(store)
    parts.heartbeat = None
    if store is not None and on_db_time is not None:
        parts.heartbeat = Heartbeat(store, on_db_time, parts.logger, on_pauses)
        if parts.capabilities.schedules is not None:
            parts.heartbeat.also.extend(reads)
    if parts.capabilities.follow_clock is not None:
        parts.capabilities.follow_clock(clock)
    for runner in parts.runners.values():
        runner.clock = parts.ticking
        runner.leases = None if runner.job.every_instance else parts.leases


def check_history(history: object) -> int:
    """``Scheduler(history=)``, checked."""
    if not is_whole(history, 0, 10_000):
        raise ConfigurationError(
            f"Scheduler(history={short(history)}): the runs kept per job, a whole "
            "number from 0 to 10000"
        )
    return history


def check_parts(lifespan: object, logger: object, store: object, clock: object) -> None:
    """Refuse, with what to do, the parts of a Scheduler that cannot work."""
    if lifespan is not None and not callable(lifespan):
        raise ConfigurationError(
            f"Scheduler(lifespan={short(lifespan)}): pass the app's lifespan function "
            "(app -> async context manager), as FastAPI(lifespan=...) takes it"
        )
    if logger is not None and not isinstance(logger, logging.Logger):
        raise ConfigurationError(
            f"Scheduler(logger={short(logger)}): pass a logging.Logger, "
            "e.g. logging.getLogger('myapp.jobs')"
        )
    if isinstance(store, str):
        raise ConfigurationError(
            f"Scheduler(store={short(store)}): a store is not a URL; wrap it: "
            "store=SQLAlchemyStore(url) (from fastapi_jobs.stores import SQLAlchemyStore)"
        )
    # The protocols say what a store and a clock have: checked against them,
    # not against a list kept here beside them.
    if store is not None and not isinstance(store, Store):
        raise ConfigurationError(
            f"Scheduler(store={short(store)}) is not a store: it lacks "
            f"{', '.join(missing(store, Store))} (fastapi_jobs.stores.Store says what one "
            "has): pass fastapi_jobs.stores.SQLAlchemyStore(...)"
        )
    if isinstance(clock, type):
        raise ConfigurationError(
            f"Scheduler(clock={clock.__name__}) is a class: pass a clock, e.g. "
            f"{clock.__name__}() or LoopClock(start)"
        )
    if clock is not None and not isinstance(clock, Clock):
        raise ConfigurationError(
            f"Scheduler(clock={short(clock)}) is not a Clock: pass SystemClock() "
            "or LoopClock(start) (or an object with now() and sleep_until())"
        )
