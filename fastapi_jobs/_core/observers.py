"""Run hooks: observers the scheduler tells about each run and each skipped tick.

An observer is any object with some of the methods of `Observer`
(``run_started``, ``run_finished``, ``tick_skipped``, ``lease_lost``), each
taking one event. A plain method is called at once: ``run_started`` and
``run_finished`` in the job's own task (so a tracer can make its span current
for the run), the others where the skip or the loss is noticed (the timer's
task, the job's task); it must be quick. An
``async def`` method is queued and awaited by one task of the scheduler, in
the order of the events, so a slow webhook delays no run. An observer that
raises is logged and the job goes on. Without observers, a run pays one
attribute check.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import NamedTuple

import anyio

from .._clock import as_datetime
from .._errors import ConfigurationError, short
from .._status import Outcome, SkipReason, utc

__all__ = [
    "KINDS",
    "LeaseLost",
    "Observer",
    "Observers",
    "RunFinished",
    "RunStarted",
    "TickSkipped",
]

_new = tuple.__new__  # a NamedTuple without its Python __new__: events are made per run
KINDS = ("run_started", "run_finished", "tick_skipped", "lease_lost")
# Async observers' events waiting to be delivered, at most; past it the oldest
# are dropped (and counted in a warning), so a stuck webhook costs bounded memory.
QUEUE = 10_000
# At shutdown, async observers get this long to take the last events.
FLUSH = 5.0


class RunStarted(NamedTuple):
    """A run (one attempt) of a job has started. Times are POSIX seconds (cheap to
    make for every run); ``tick_at`` and ``started_at`` give them as datetimes."""

    job: str
    tick: float
    """The tick it runs for (for a run by hand, when it was asked for)."""
    started: float
    attempt: int
    """1, then 2, 3... for the retries of the same tick."""
    manual: bool
    fence: int | None
    instance: str
    asked_from: contextvars.Context | None = None
    """For a run asked for by hand (``trigger``, ``POST /jobs/{name}/run``): the
    context of the caller, e.g. a request, to read its context variables (the
    run itself starts from the scheduler's context, never the caller's)."""

    @property
    def tick_at(self) -> datetime:
        return as_datetime(self.tick)

    @property
    def started_at(self) -> datetime:
        return as_datetime(self.started)


class RunFinished(NamedTuple):
    """A run (one attempt) of a job has ended (times as in `RunStarted`)."""

    job: str
    tick: float
    started: float
    attempt: int
    manual: bool
    fence: int | None
    instance: str
    outcome: Outcome
    duration_s: float
    error: BaseException | None
    """The job's exception (a ``TimeoutError`` if it timed out); None if ok or cancelled."""

    @property
    def tick_at(self) -> datetime:
        return as_datetime(self.tick)

    @property
    def started_at(self) -> datetime:
        return as_datetime(self.started)


class TickSkipped(NamedTuple):
    """Ticks of a job that did not run here (``ticks`` of them: several for
    ``missed``), from ``tick`` (POSIX seconds; None if unknown)."""

    job: str
    tick: float | None
    reason: SkipReason
    ticks: int
    instance: str

    @property
    def tick_at(self) -> datetime | None:
        return utc(self.tick)


class LeaseLost(NamedTuple):
    """A claimed run lost its lease and was cancelled."""

    job: str
    fence: int
    reason: str
    instance: str


class Observer:
    """A base class for observers: override the methods you need (or write any
    object with some of these methods; ``async def`` ones are queued)."""

    def run_started(self, event: RunStarted) -> Awaitable[None] | None:
        return None

    def run_finished(self, event: RunFinished) -> Awaitable[None] | None:
        return None

    def tick_skipped(self, event: TickSkipped) -> Awaitable[None] | None:
        return None

    def lease_lost(self, event: LeaseLost) -> Awaitable[None] | None:
        return None


Hook = Callable[[object], object]


class Observers:
    """The observers of one scheduler: calls the plain hooks, queues the async ones."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.instance = ""
        self._sync: dict[str, list[Hook]] = {kind: [] for kind in KINDS}
        self._async: dict[str, list[Hook]] = {kind: [] for kind in KINDS}
        self._queue: deque[tuple[Hook, object]] = deque()
        self._dropped = 0
        self._wanted: anyio.Event | None = None  # set when an event is queued
        self._delivering = False
        self._drained: anyio.Event | None = None  # set when the queue is empty (flush)
        # Whether anyone listens to runs starting and ending: read per run, so a
        # flag each, not two dict lookups (a run pays nothing for a kind no one
        # observes: metrics observe only the ends).
        self.wants_started = self.wants_finished = False
        self._any = False  # any hook at all: asked once per job as it is built
        # The one plain run_finished hook when it is the only one (the metrics'
        # recorder, usually): called without _emit's loops (a tenth of a tick);
        # the recorder's own figures method, if it is that, without an event.
        self._sole_finished: Hook | None = None
        self._sole_figures: Callable[[str, float, float, int, bool, float], None] | None = None

    def add(self, observer: object) -> None:
        hooks = {
            kind: method
            for kind in KINDS
            if callable(method := getattr(observer, kind, None))
            and getattr(type(observer), kind, None) is not getattr(Observer, kind)
        }
        if not hooks:
            raise ConfigurationError(
                f"{short(observer)} is not an observer: give it one or more of the methods "
                f"{', '.join(KINDS)} (see fastapi_jobs.observers.Observer)"
            )
        for kind, method in hooks.items():
            is_async = inspect.iscoroutinefunction(method)
            (self._async if is_async else self._sync)[kind].append(method)
        self._any = True
        self.wants_started = bool(self._sync["run_started"] or self._async["run_started"])
        self.wants_finished = bool(self._sync["run_finished"] or self._async["run_finished"])
        sole = len(self._sync["run_finished"]) == 1 and not self._async["run_finished"]
        self._sole_finished = self._sync["run_finished"][0] if sole else None
        # Only the library's recorder (fastapi_jobs.metrics) has run_figures.
        owner = getattr(self._sole_finished, "__self__", None)
        ours = type(owner).__module__ == "fastapi_jobs.metrics._recorders"
        self._sole_figures = getattr(owner, "run_figures", None) if ours else None

    def __bool__(self) -> bool:
        # A flag, not a look over the hooks: 100,000 stored schedules ask at start.
        return self._any

    # -- events -----------------------------------------------------------------

    def started(
        self,
        job: str,
        tick: float,
        started: float,
        attempt: int,
        manual: bool,
        fence: int | None,
        asked_from: contextvars.Context | None = None,
    ) -> None:
        if self.wants_started:
            event = (job, tick, started, attempt, manual, fence, self.instance, asked_from)
            self._emit("run_started", _new(RunStarted, event))

    def finished(
        self,
        job: str,
        tick: float,
        started: float,
        attempt: int,
        manual: bool,
        fence: int | None,
        outcome: Outcome,
        duration: float,
        error: BaseException | None,
    ) -> None:
        if self.wants_finished:
            figures = self._sole_figures
            if figures is not None:
                figures(job, tick, started, attempt, manual, duration)
                return
            instance = self.instance
            event = (job, tick, started, attempt, manual, fence, instance, outcome, duration, error)
            hook = self._sole_finished
            if hook is None:
                self._emit("run_finished", _new(RunFinished, event))
                return
            try:
                result = hook(_new(RunFinished, event))
            except (Exception, SystemExit, asyncio.CancelledError) as exc:  # noqa: BLE001
                self._failed(hook, exc)  # as in _emit
                return
            if result is not None:
                self._returned(hook, result)

    def skipped(self, job: str, tick: float | None, reason: SkipReason, count: int) -> None:
        if self._sync["tick_skipped"] or self._async["tick_skipped"]:
            self._emit("tick_skipped", TickSkipped(job, tick, reason, count, self.instance))

    def lost(self, job: str, fence: int, reason: str) -> None:
        if self._sync["lease_lost"] or self._async["lease_lost"]:
            self._emit("lease_lost", LeaseLost(job, fence, reason, self.instance))

    def _emit(self, kind: str, event: object) -> None:
        for hook in self._sync[kind]:
            try:
                result = hook(event)
            except (Exception, SystemExit, asyncio.CancelledError) as exc:  # noqa: BLE001
                # An observer's bug, whatever it raised: never the job's.
                self._failed(hook, exc)
                continue
            if result is not None:
                self._returned(hook, result)
        hooks = self._async[kind]
        if hooks:
            queue = self._queue
            for hook in hooks:
                if len(queue) >= QUEUE:
                    queue.popleft()
                    self._dropped += 1
                queue.append((hook, event))
            if self._wanted is not None:
                self._wanted.set()

    def _returned(self, hook: Hook, result: object) -> None:
        """A plain hook returned ``result``: an awaitable is its bug (never awaited)."""
        if not inspect.isawaitable(result):
            return
        if inspect.iscoroutine(result):
            result.close()  # never awaited: no warning about it
        self._failed(
            hook,
            TypeError(
                f"it returned {type(result).__name__}, which is not awaited: "
                "declare the method `async def`"
            ),
        )

    def _failed(self, hook: Hook, exc: BaseException) -> None:
        owner = getattr(hook, "__self__", None)
        name = getattr(hook, "__name__", repr(hook))
        self.logger.warning(
            "observer %s raised %r; the job and the other observers go on",
            name if owner is None else f"{type(owner).__name__}.{name}",
            exc,
            exc_info=exc,
        )

    # -- the async observers' task ------------------------------------------------

    async def run(self) -> None:
        """Deliver the queued events to the async observers, in order, until
        cancelled (after `flush`)."""
        queue = self._queue
        try:
            while True:
                self._wanted = wanted = anyio.Event()
                if not queue:
                    if self._drained is not None:
                        self._drained.set()
                    await wanted.wait()
                if self._dropped:
                    self.logger.warning(
                        "observers fell behind: %d event(s) dropped (at most %d wait)",
                        self._dropped,
                        QUEUE,
                    )
                    self._dropped = 0
                hook, event = queue.popleft()
                self._delivering = True
                try:
                    await hook(event)  # type: ignore[misc]
                except (Exception, SystemExit) as exc:  # noqa: BLE001 - the observer's bug
                    self._failed(hook, exc)
                finally:
                    self._delivering = False
        finally:
            self._wanted = None

    async def flush(self) -> None:
        """Wait for `run` to deliver what is queued, for at most ``FLUSH``
        seconds (shutdown); then log what is left and forget it."""
        if self._queue or self._delivering:
            self._drained = drained = anyio.Event()
            if self._wanted is not None:
                self._wanted.set()
            with anyio.move_on_after(FLUSH):
                await drained.wait()
            self._drained = None
        left = len(self._queue) + self._delivering
        if left:
            self.logger.warning("shutdown: %d observer event(s) not delivered in %gs", left, FLUSH)
            self._queue.clear()
