"""The life of one job inside the scheduler: its loop and its guarded run.

The loop waits for the next tick of the job's schedule, runs the job, and
computes the following tick from the schedule's grid, never from when the
run ended, so nothing drifts. A run is awaited in the loop itself: ticks
that come while it goes are dropped (and counted), never queued, and no task
is spawned per run.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio

from ._clock import Clock
from ._context import JobContext
from ._errors import LeaseLostError
from ._job import Job
from ._leases import LeaseKeeper
from ._status import ErrorInfo, JobStats, Outcome
from ._store import Store

__all__ = ["JobRunner", "RunResult"]

_DEBUG = logging.DEBUG
_NOT_A_STOP = (
    "; raised by the job's own code, it is the job's failure, not a request to stop "
    "the app (the next tick runs as usual)"
)

# Timers may fire a hair before the wall clock reaches the tick (the loop
# sleeps on the monotonic clock); closer than this counts as on time.
_EARLY = 0.001


def _cancelled_from_outside(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation that someone asked for, as opposed
    to a ``CancelledError`` the job's own code raised (a future that something
    else cancelled, say), which is the job's failure."""
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        # Every cancellation of a task (ours, anyio's scopes, the caller's)
        # goes through task.cancel(), which counts itself here.
        return task is None or task.cancelling() > 0
    return isinstance(exc, anyio.get_cancelled_exc_class())


def _is_cancellation(exc: BaseException) -> bool:
    # asyncio first: anyio.get_cancelled_exc_class() finds the running
    # library on each call, and 10,000 loops stop at once at shutdown.
    if isinstance(exc, asyncio.CancelledError):
        return True
    return isinstance(exc, anyio.get_cancelled_exc_class())


@dataclass(frozen=True, slots=True)
class RunResult:
    """What :meth:`Scheduler.run_now` returns: how one run ended."""

    name: str
    outcome: Outcome
    tick: datetime
    duration_s: float
    error: BaseException | None
    """The exception of a failed run (a ``TimeoutError`` for a timed-out one)."""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class JobRunner:
    """Runs one job: on its schedule (:meth:`loop`) or now (:meth:`run`)."""

    __slots__ = (
        "_cancel",
        "_clock",
        "_in_loop_run",
        "_logger",
        "_parent_logger",
        "_stopping",
        "_thread_done",
        "_unreleased",
        "job",
        "leases",
        "stats",
        "store",
    )

    def __init__(
        self,
        job: Job,
        clock: Clock,
        logger: logging.Logger,
        leases: LeaseKeeper | None = None,
    ) -> None:
        self.job = job
        self.stats = JobStats()
        self.leases = None if job.every_instance else leases
        """Keeps the leases of claimed runs; None: every instance runs every tick."""
        self.store = None if self.leases is None else self.leases.store
        """Where ticks are claimed (the keeper's store), or None."""
        self._clock = clock
        self._parent_logger = logger
        self._logger: logging.Logger | None = None
        self._cancel: Callable[[], object] | None = None
        self._stopping = False
        self._in_loop_run = False
        self._unreleased: int | None = None  # the fence of a release that failed
        self._thread_done: threading.Event | None = None  # set when the sync job's thread returns

    @property
    def logger(self) -> logging.Logger:
        """``<scheduler logger>.<job name>``; made on first use (a logger per job
        is a lasting entry in logging's registry)."""
        if self._logger is None:
            self._logger = self._parent_logger.getChild(self.job.name)
        return self._logger

    # -- the loop ---------------------------------------------------------

    def arm(self) -> None:
        """Make ready to loop again (a scheduler can be started more than once)."""
        self._stopping = False

    def bind(self, cancel: Callable[[], object]) -> None:
        """Give the loop how to cancel the task (or scope) that runs it."""
        self._cancel = cancel

    async def loop(self, state: Mapping[str, Any]) -> None:
        """Run the job on its schedule until :meth:`stop` (or cancellation)."""
        # The hot path of the library: one pass per tick of every job. Keep
        # it to plain attribute reads and as few awaits and calls as can be.
        clock, schedule, stats = self._clock, self.job.schedule, self.stats
        try:
            if self._stopping:
                return
            now = clock.now()
            tick = schedule.next_after(now)
            first = None
            if self.job.run_on_startup or self.job.catch_up is not None:
                first = await self._first_tick(now)
            if first is not None:
                stats.next_run_at = tick
                await self._run_in_loop(first, state, now)
                if self._stopping:
                    return
                tick = self._after_run(first, tick)
            while True:
                stats.next_run_at = tick
                await clock.sleep_until(tick)
                now = clock.now()
                if now < tick - _EARLY:
                    continue  # woke early: the wall clock was stepped back
                nxt = schedule.next_after(tick)
                if nxt <= now:
                    # Woke late (blocked loop, machine asleep): only the
                    # latest due tick runs.
                    missed, tick = schedule.ticks_between(tick, now)
                    stats.skip("missed", missed)
                    nxt = schedule.next_after(tick)
                # A run started by hand, or the thread of a cut run, is going (the
                # property `busy`, inlined: this runs on every tick).
                thread = self._thread_done
                if stats.running or (thread is not None and not thread.is_set()):
                    stats.skip("overlap")
                    tick = nxt
                    continue
                stats.next_run_at = nxt
                await self._run_in_loop(tick, state, now)
                if self._stopping:
                    return
                # The next tick comes from the grid; ticks that passed while
                # the run went were dropped, not queued.
                finished = stats.last_finished_at
                tick = nxt if finished is None or nxt > finished else self._after_run(tick, nxt)
        except BaseException as exc:
            if not (self._stopping and _is_cancellation(exc)):
                raise  # a cancellation from outside is never swallowed
            # Our own stop() or cut(): the loop ends quietly.
        finally:
            self._cancel = None
            stats.next_run_at = None

    def _after_run(self, ran_for: float, nxt: float) -> float:
        """The tick to wait for after the run for ``ran_for``; count overlaps."""
        end = self._clock.now()
        if nxt > end:
            return nxt
        dropped, last = self.job.schedule.ticks_between(ran_for, end)
        self.stats.skip("overlap", dropped)
        return self.job.schedule.next_after(last)

    async def _first_tick(self, now: float) -> float | None:
        """The tick to run at once when the loop starts, if any."""
        job = self.job
        first = None if job.catch_up is None else await self._missed_tick(now, job.catch_up)
        if first is None and job.run_on_startup:
            # Claimed jobs run the current period's tick, so that instances
            # starting together run it once between them.
            first = now if self.store is None else job.schedule.last_at_or_before(now)
        return first

    async def _missed_tick(self, now: float, deadline: float) -> float | None:
        """After downtime, the latest missed tick if it is within ``deadline``."""
        assert self.store is not None
        try:
            with anyio.fail_after(self.store.timeout):
                last = await self.store.last_tick(self.job.name)
        except Exception as exc:  # noqa: BLE001 - fail closed: no catch-up without history
            self.logger.warning(
                "job %r: cannot read its last tick (%r); no catch-up run",
                self.job.name,
                exc,
                extra={"job": self.job.name},
            )
            return None
        if last is None:
            return None  # first deploy: nothing was missed
        missed, latest = self.job.schedule.ticks_between(last, now)
        if not missed:
            return None
        if now - latest > deadline:
            self.stats.skip("missed", missed)
            return None
        self.stats.skip("missed", missed - 1)
        self.logger.info(
            "job %r: %d tick(s) missed while down; catching up on the latest, %s",
            self.job.name,
            missed,
            datetime.fromtimestamp(latest, UTC).isoformat(),
            extra={"job": self.job.name},
        )
        return latest

    async def _run_in_loop(self, tick: float, state: Mapping[str, Any], now: float) -> None:
        self._in_loop_run = True
        try:
            if self.leases is None:
                await self.run(tick, state, started=now)
            else:
                await self._run_claimed(self.leases, tick, state)
        finally:
            self._in_loop_run = False

    # -- claims -----------------------------------------------------------

    async def _run_claimed(
        self, leases: LeaseKeeper, tick: float, state: Mapping[str, Any]
    ) -> None:
        """Claim the tick in the store; if ours, run it under a renewed lease."""
        name, stats, store = self.job.name, self.stats, leases.store
        if self._unreleased is not None:
            # The database missed the last release (it was down): until it has
            # it, our own lease would keep this tick from being claimed.
            await self._release(store, self._unreleased)
        claimed_at = anyio.current_time()
        try:
            with anyio.fail_after(store.timeout):
                fence = await store.claim(name, tick)
        except Exception as exc:  # noqa: BLE001 - fail closed: skip, retry next tick
            stats.skip("store_unavailable")
            self.logger.warning(
                "job %r: store unreachable, tick skipped: %r", name, exc, extra={"job": name}
            )
            return
        if fence is None:
            stats.skip("claimed_elsewhere")
            return
        run_scope = anyio.CancelScope()
        lease = leases.hold(name, fence, claimed_at, run_scope, self.logger)
        try:
            with run_scope:
                await self.run(tick, state, fence=fence)
        finally:
            leases.end(lease)
            if lease.lost is not None:
                self._record_lost(lease.lost)
            # Cut at shutdown while its thread goes on, the claim stays held until
            # the lease runs out, so that no peer starts the job beside the thread.
            elif not self.thread_running:
                with anyio.CancelScope(shield=True):
                    await self._release(store, fence)

    def _record_lost(self, reason: str) -> None:
        stats, name = self.stats, self.job.name
        stats.failures += 1
        stats.last_outcome = "cancelled"
        stats.last_error = LeaseLostError(f"lease lost: {reason}; the run was cancelled")
        self.logger.error(
            "job %r lost its lease (%s): run cancelled", name, reason, extra={"job": name}
        )

    async def _release(self, store: Store, fence: int) -> None:
        self._unreleased = fence
        stats = self.stats
        error = stats.last_error if stats.last_outcome in ("failed", "timed_out") else None
        try:
            with anyio.fail_after(store.timeout):
                await store.release(
                    self.job.name,
                    fence,
                    stats.last_outcome or "cancelled",
                    None if error is None else str(ErrorInfo.of(error)),
                    stats.last_duration or 0.0,
                )
        except Exception as exc:  # noqa: BLE001 - retried; else the lease expires
            self.logger.warning(
                "job %r: could not release its claim (%r); retried at the next tick, "
                "or it frees when the lease ends",
                self.job.name,
                exc,
                extra={"job": self.job.name},
            )
        else:
            self._unreleased = None

    def stop(self) -> None:
        """Stop ticking: at once if idle, else after the run in flight."""
        self._stopping = True
        if not self._in_loop_run and self._cancel is not None:
            self._cancel()

    @property
    def in_flight(self) -> bool:
        """The loop is inside a run (what shutdown waits for)."""
        return self._in_loop_run

    def cut(self) -> None:
        """Cancel the run in flight (shutdown deadline passed)."""
        if self._cancel is not None:
            self._cancel()

    # -- one run ----------------------------------------------------------

    async def run(
        self,
        tick: float,
        state: Mapping[str, Any],
        *,
        manual: bool = False,
        fence: int | None = None,
        started: float | None = None,
    ) -> Outcome:
        """Run the job once, guarded: whatever the job raises is logged and
        recorded, never raised; a cancellation from outside the job (shutdown,
        timeout, lost lease, the caller) is recorded and re-raised."""
        job, stats = self.job, self.stats
        if started is None:
            started = self._clock.now()
        stats.running = True
        stats.runs += 1
        stats.last_started_at = started
        outcome: Outcome = "cancelled"
        error: BaseException | None = None
        try:
            args: tuple[JobContext, ...] = ()
            if job.takes_context:
                args = (self._context(tick, state, manual, fence),)
            if not job.is_async:
                error = await self._call_sync(args)
            elif job.timeout is None:
                await job.func(*args)
            else:
                with anyio.move_on_after(job.timeout) as scope:
                    await job.func(*args)
                if scope.cancel_called:
                    error = TimeoutError(f"the run passed its timeout of {job.timeout:g}s")
            outcome = "ok" if error is None else "timed_out"
        except Exception as exc:  # noqa: BLE001 - a job's error is recorded, never raised
            outcome, error = "failed", exc
        except BaseException as exc:
            if _cancelled_from_outside(exc):
                raise
            # The job's own CancelledError, SystemExit, KeyboardInterrupt: a bug
            # in the job, not a request to stop the site. Its failure, like any.
            outcome, error = "failed", exc
        finally:
            stats.last_finished_at = finished = self._clock.now()
            # The wall clock may be stepped back mid-run (NTP): never below 0.
            duration = max(0.0, finished - started)
            stats.running = False
            stats.last_duration = duration
            stats.last_outcome = outcome
            if outcome != "ok":
                self._report(outcome, error, duration)
            elif self._parent_logger.isEnabledFor(_DEBUG):
                self.logger.debug(
                    "job %r ran ok in %.3fs", job.name, duration, extra={"job": job.name}
                )
        return outcome

    @property
    def busy(self) -> bool:
        """A run is going, or the thread of an earlier one has not returned yet."""
        done = self._thread_done
        return self.stats.running or (done is not None and not done.is_set())

    @property
    def thread_running(self) -> bool:
        """A thread of this job runs on after its run was cut or abandoned."""
        done = self._thread_done
        return not self.stats.running and done is not None and not done.is_set()

    async def _call_sync(self, args: tuple[JobContext, ...]) -> TimeoutError | None:
        """Run the sync job in a worker thread; a TimeoutError if it passed its timeout.

        A thread cannot be interrupted. Past the timeout the run is reported at
        once and then waited for, so the job stays "running" (ticks drop as
        overlap, a claim's lease is kept) until its thread returns: never two
        copies at once. Cancelled from outside (shutdown, lost lease), the wait
        is abandoned, and :attr:`busy` stays true until the thread returns.
        """
        job, done = self.job, threading.Event()
        self._thread_done = done

        def call() -> None:
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

        if job.timeout is None:
            await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
            return None
        with anyio.move_on_after(job.timeout):
            await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        if done.is_set():
            # Ended in time, or just after the deadline: the result counts.
            return None
        self.logger.error(
            "job %r passed its timeout of %gs; its thread cannot be stopped and the "
            "job counts as running until it returns",
            job.name,
            job.timeout,
            extra={"job": job.name, "outcome": "timed_out"},
        )
        await anyio.to_thread.run_sync(done.wait, abandon_on_cancel=True)
        return TimeoutError(f"the run passed its timeout of {job.timeout:g}s")

    def _context(
        self, tick: float, state: Mapping[str, Any], manual: bool, fence: int | None
    ) -> JobContext:
        return JobContext(
            name=self.job.name,
            tick=datetime.fromtimestamp(tick, UTC),
            state=state,
            logger=self.logger,
            fence=fence,
            manual=manual,
        )

    def _report(self, outcome: Outcome, error: BaseException | None, duration: float) -> None:
        stats, name = self.stats, self.job.name
        extra = {"job": name, "outcome": outcome, "duration_s": duration}
        if outcome == "cancelled":
            # Shutdown logs which jobs it cut; keep the previous error visible.
            self.logger.warning("job %r was cancelled after %.3fs", name, duration, extra=extra)
            return
        stats.failures += 1
        stats.last_error = error
        if outcome == "timed_out":
            note = "" if self.job.is_async else " (when its thread returned)"
            self.logger.error("job %r timed out after %.3fs%s", name, duration, note, extra=extra)
        else:
            self.logger.error(
                "job %r failed after %.3fs: %r%s",
                name,
                duration,
                error,
                _NOT_A_STOP if not isinstance(error, Exception) else "",
                exc_info=error,
                extra=extra,
            )
