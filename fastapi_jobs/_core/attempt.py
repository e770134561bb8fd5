"""One run of a job, guarded: whatever it raises is recorded, never raised
(`run_once`, the runner's collaborator: ``_core.runner``'s `JobRunner` calls
it for each attempt of a tick).

A run is timed out (an async job is cut at its timeout; a sync job runs in a
worker thread, which cannot be cut, and is waited for), counted in the job's
`fastapi_jobs._status.JobStats`, logged, and told to the observers; a
cancellation from outside the job (shutdown, a lost lease, the caller) is
recorded and re-raised. Nothing here knows about ticks, retries or claims:
it reads and sets only what `Attempted` names of its runner.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._clock import as_datetime
from .._context import JobContext
from .._results import Manual, Outcome, RunEnd, lease_lost, replaced
from .._status import JobStats
from .concurrency import cancelled_from_outside, thread_event, waited

if TYPE_CHECKING:
    from .._clock import Clock
    from .._job import Job
    from .leases import Lease
    from .observers import Observers

__all__ = ["Attempted", "run_once"]

_new = tuple.__new__
_DEBUG = logging.DEBUG
_NOT_A_STOP = (
    "; raised by the job's own code, it is the job's failure, not a request to stop "
    "the app (the next tick runs as usual)"
)


class _ThreadGate:
    """Decides, once, between a sync run's thread starting and its caller giving
    up on it first: anyio drops a call cut while it waits for a worker, and the
    two sides must agree on whether it ran."""

    __slots__ = ("_lock", "_state")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = 0  # 1: started, -1: abandoned

    def enter(self) -> bool:
        """In the thread: start, unless abandoned already."""
        with self._lock:
            if self._state == 0:
                self._state = 1
            return self._state == 1

    def abandon(self) -> bool:
        """In the caller: give up, unless the thread started already."""
        with self._lock:
            if self._state == 0:
                self._state = -1
            return self._state == -1


def _in_thread(
    job: Job, args: tuple[JobContext, ...], gate: _ThreadGate, done: threading.Event
) -> None:
    """A sync job's run, in its worker thread."""
    if not gate.enter():
        return  # given up on before a worker thread took it
    try:
        result = job.func(*args)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never awaited: no warning about it
            raise TypeError(
                f"job {job.name!r} is a sync function that returned "
                f"{type(result).__name__}, which was not awaited: declare the "
                "job `async def` (or return nothing)"
            )
    finally:
        done.set()


def _tell(args: tuple[JobContext, ...], reason: str) -> None:
    """Tell the run's context (if the job takes one: ``args`` is ``(ctx,)``, kept
    by the run for this) that it is cancelled, and why."""
    if args:
        args[0].cancellation.reason = reason


class Attempted(Protocol):
    """What a run reads and sets of its runner (`_core.runner.JobRunner`)."""

    job: Job
    stats: JobStats
    clock: Clock
    parent_logger: logging.Logger
    observers: Observers | None
    manual: Manual | None
    replaced_by: float | None
    lease: Lease | None
    stopping: bool
    thread_done: threading.Event | None

    @property
    def logger(self) -> logging.Logger: ...


async def run_once(
    runner: Attempted,
    tick: float,
    state: Mapping[str, Any],
    manual: bool = False,
    fence: int | None = None,
    started: float | None = None,
    attempt: int = 1,
    until: float | None = None,
) -> RunEnd:
    """Run ``runner``'s job once, guarded: whatever the job raises is logged and
    recorded, never raised; a cancellation from outside the job (shutdown,
    timeout, lost lease, the caller) is recorded and re-raised. ``until``:
    an async run still going then is cut, as a timeout (a retry's bound)."""
    job, stats, clock = runner.job, runner.stats, runner.clock
    started = clock.now() if started is None else started
    stats.running, stats.last_started_at = True, started
    stats.runs += 1
    outcome: Outcome = "cancelled"
    error: BaseException | None = None
    observers = runner.observers
    if observers is not None and observers.wants_started:
        _tell_started(runner, observers, tick, started, attempt, manual, fence)
    args = (_context(runner, tick, state, manual, fence),) if job.takes_context else ()
    try:
        if not job.is_async:
            error = await _call_sync(runner, args)
        elif job.timeout is not None or until is not None:
            error = await _call_timed(runner, until, started, args)
        else:
            await job.func(*args)
        outcome = "ok" if error is None else "timed_out"
    except Exception as exc:  # noqa: BLE001 - a job's error is recorded, never raised
        outcome, error = "failed", exc
    except BaseException as exc:
        if cancelled_from_outside(exc):
            error = None if runner.replaced_by is None else replaced(runner.replaced_by)
            _tell(args, _why_cancelled(runner))
            raise
        # The job's own CancelledError, SystemExit...: a bug in it, its failure.
        outcome, error = "failed", exc
    finally:
        finished = clock.now()
        # The wall clock may be stepped back mid-run (NTP): never below 0.
        duration = finished - started if finished > started else 0.0
        if outcome == "ok":  # stats.ended(), inlined: the hot path
            stats.running = False
            stats.last_finished_at = stats.last_ok_at = finished
            stats.last_duration, stats.last_outcome = duration, outcome
            stats.ok += 1
            if runner.parent_logger.isEnabledFor(_DEBUG):
                _ran_ok(runner, duration)
        else:
            _report(runner, outcome, error, finished, duration)
        if observers is not None and observers.wants_finished:
            observers.finished(
                job.name, tick, started, attempt, manual, fence, outcome, duration, error
            )
    return _new(RunEnd, (outcome, error, duration, started, 1))  # RunEnd(...) without its __new__


def _ran_ok(runner: Attempted, duration: float) -> None:
    name = runner.job.name
    runner.logger.debug("job %r ran ok in %.3fs", name, duration, extra={"job": name})


def _tell_started(
    runner: Attempted,
    observers: Observers,
    tick: float,
    started: float,
    attempt: int,
    manual: bool,
    fence: int | None,
) -> None:
    asked = runner.manual
    asked_from = None if asked is None or not manual else asked.asked_from
    observers.started(runner.job.name, tick, started, attempt, manual, fence, asked_from)


def _still_running(runner: Attempted, args: tuple[JobContext, ...]) -> None:
    """A sync run cancelled from outside (lease lost, shutdown past its
    deadline, replaced) whose thread goes on: told (ctx.cancelled), and said
    to be running."""
    name, why = runner.job.name, _why_cancelled(runner)
    _tell(args, why)
    runner.logger.warning(
        "job %r: its run is cancelled (%s), but its thread cannot be stopped "
        "and is still running; the job can return once ctx.cancelled is true",
        name,
        why,
        extra={"job": name},
    )


def _why_cancelled(runner: Attempted) -> str:
    """What `JobContext.cancel_reason` says of a run cancelled from outside."""
    lease = runner.lease
    if lease is not None and lease.lost is not None:
        return f"lease lost: {lease.lost}"
    if runner.replaced_by is not None:
        return "replaced by a newer tick"
    if runner.stopping:
        return "the job is stopping: the app's shutdown, or its schedule changed"
    return "cancelled"


async def _call_timed(
    runner: Attempted, until: float | None, started: float, args: tuple[JobContext, ...]
) -> TimeoutError | None:
    """Run the async job, cut at its timeout, or at ``until`` (a retry's
    bound) if that comes first: a TimeoutError if it was cut."""
    limit = runner.job.timeout
    if until is not None and (limit is None or until - started < limit):
        limit = max(0.0, until - started)
    else:
        until = None  # the job's own timeout comes first
    with anyio.move_on_after(limit) as scope:
        await runner.job.func(*args)
    if not scope.cancel_called:
        return None
    _tell(args, "timed out")
    return TimeoutError(
        f"the run passed its timeout of {limit:g}s"
        if until is None
        else "the retry was cut before the job's next tick, which runs as usual"
    )


async def _call_sync(runner: Attempted, args: tuple[JobContext, ...]) -> TimeoutError | None:
    """Run the sync job in a worker thread (`_in_worker`), seen by a test's
    virtual time until both its thread and this wait are over."""
    done = thread_event()
    try:
        return await _in_worker(runner, args, done)
    finally:
        waited(done)


async def _in_worker(
    runner: Attempted, args: tuple[JobContext, ...], done: threading.Event
) -> TimeoutError | None:
    """Run the sync job in a worker thread, which sets ``done`` as it ends; a
    TimeoutError if it passed its timeout.

    A thread cannot be interrupted. Past the timeout the run is reported at
    once and then waited for, so the job stays "running" (ticks drop as
    overlap, a claim's lease is kept) until its thread returns: never two
    copies at once. Cancelled from outside (shutdown, lost lease), the wait
    is abandoned, and `busy` stays true until the thread returns.
    """
    job = runner.job
    runner.thread_done = done
    gate = _ThreadGate()
    try:
        if job.timeout is None:
            await anyio.to_thread.run_sync(
                _in_thread, job, args, gate, done, abandon_on_cancel=True
            )
            return None
        with anyio.move_on_after(job.timeout):
            await anyio.to_thread.run_sync(
                _in_thread, job, args, gate, done, abandon_on_cancel=True
            )
    except BaseException:
        # Cut while it waited for a worker thread (all of them busy): it will
        # never run, and must not leave the job "running" for good.
        if gate.abandon():
            done.set()
        elif not done.is_set():
            _still_running(runner, args)
        raise
    if done.is_set():
        # Ended in time, or just after the deadline: the result counts.
        return None
    if gate.abandon():
        done.set()
        return TimeoutError(
            f"the run passed its timeout of {job.timeout:g}s waiting for a worker "
            "thread (every one busy); it did not start"
        )
    _tell(args, "timed out")
    runner.logger.error(
        "job %r passed its timeout of %gs; its thread cannot be stopped and the "
        "job counts as running until it returns (or sees ctx.cancelled)",
        job.name,
        job.timeout,
        extra={"job": job.name, "outcome": "timed_out"},
    )
    await anyio.to_thread.run_sync(done.wait, abandon_on_cancel=True)
    return TimeoutError(f"the run passed its timeout of {job.timeout:g}s")


def _context(
    runner: Attempted, tick: float, state: Mapping[str, Any], manual: bool, fence: int | None
) -> JobContext:
    return JobContext(
        name=runner.job.name,
        tick=as_datetime(tick),
        state=state,
        logger=runner.logger,
        fence=fence,
        manual=manual,
    )


def _report(
    runner: Attempted,
    outcome: Outcome,
    error: BaseException | None,
    finished: float,
    duration: float,
) -> None:
    """Count and log a run that did not end ok: the one place that does."""
    stats, name = runner.stats, runner.job.name
    extra = {"job": name, "outcome": outcome, "duration_s": duration}
    if outcome == "cancelled":
        lease = runner.lease
        if error is not None:  # replaced by a newer tick (overlap="replace")
            stats.ended(outcome, error, finished, duration)
            runner.logger.warning(
                "job %r: run cancelled after %.3fs: %s", name, duration, error, extra=extra
            )
            return
        if lease is None or lease.lost is None:
            # Shutdown logs which jobs it cut; keep the previous error visible.
            stats.ended(outcome, None, finished, duration)
            runner.logger.warning("job %r was cancelled after %.3fs", name, duration, extra=extra)
            return
        lease.told = True
        stats.ended(outcome, lease_lost(lease.lost, while_running=True), finished, duration)
        if runner.observers is not None:  # before run_finished: a tracer's span is open
            runner.observers.lost(name, lease.fence, lease.lost)
        runner.logger.error(
            "job %r lost its lease (%s): run cancelled after %.3fs",
            name,
            lease.lost,
            duration,
            extra=extra,
        )
        return
    stats.ended(outcome, error, finished, duration)
    if outcome == "timed_out":
        note = "" if runner.job.is_async else " (when its thread returned)"
        runner.logger.error(
            "job %r timed out after %.3fs%s: %s", name, duration, note, error, extra=extra
        )
    else:
        runner.logger.error(
            "job %r failed after %.3fs: %r%s",
            name,
            duration,
            error,
            _NOT_A_STOP if not isinstance(error, Exception) else "",
            exc_info=error,
            extra=extra,
        )
