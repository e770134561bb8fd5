"""The life of one job inside the scheduler: its task and its guarded run.

The job's task parks until the dispatcher wakes it for a tick (see
``_dispatcher``), runs the job, and parks again. A run is awaited in the task
itself: ticks that come while it goes are dropped (and counted by the
dispatcher), never queued, and no task is spawned per run.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import anyio

from ._clock import Clock
from ._context import JobContext
from ._errors import LeaseLostError
from ._history import History
from ._job import Job
from ._leases import Lease, LeaseKeeper
from ._schedules import Every
from ._status import ErrorInfo, JobStats, Outcome, SkipReason
from ._store import Ended

if TYPE_CHECKING:
    from ._claims import Claims
    from ._observe import Observers

__all__ = ["CUT_BEFORE_TICK", "HISTORY", "JobRunner", "Manual", "Ran", "RunResult", "backoff"]

_US = 1_000_000
_new = tuple.__new__
HISTORY = 50
"""Runs of each unclaimed job this process remembers, by default (``Scheduler(history=)``)."""
CUT_BEFORE_TICK = 0.01
"""A retry still going this long before the job's next tick is cut: the timer
may fire a millisecond early, and must find the job free (an earlier deadline
is handled first by the event loop, even one blocked past both)."""


class Dispatching(Protocol):
    """What a job's task needs of the dispatcher (``_dispatcher.Dispatcher``)."""

    def add(self, runner: JobRunner, tick: float) -> None: ...


class Spawning(Protocol):
    """What a runner needs of the owner of the jobs' tasks (``_tasks.JobTasks``)."""

    def spawn(self, runner: JobRunner) -> None: ...


_DEBUG = logging.DEBUG
_NOT_A_STOP = (
    "; raised by the job's own code, it is the job's failure, not a request to stop "
    "the app (the next tick runs as usual)"
)


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
    attempts: int = 1
    """Runs it took: 1, plus the retries."""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class Ran(NamedTuple):
    """How one run (or a tick's runs, retries included) ended."""

    outcome: Outcome
    error: BaseException | None
    duration: float
    started: float
    attempts: int


class Manual:
    """A run asked for by hand (``Scheduler.trigger``), run by the job's task."""

    __slots__ = ("asked_from", "done", "ran")

    def __init__(self) -> None:
        self.ran: Ran | None = None
        """How it ended; None until :attr:`done` (and for a cancelled run)."""
        self.done = anyio.Event()
        self.asked_from = contextvars.copy_context()
        """The caller's context (its request, its span), for the observers."""


def backoff(base: float, attempt: int) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): ``base`` doubled each time,
    between half of that and all of it (jitter, so that jobs failing together do
    not retry together)."""
    delay = base * 2.0 ** min(attempt - 1, 60)
    return random.uniform(delay / 2, delay)


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


class JobRunner:
    """Runs one job: when the dispatcher wakes it (:meth:`serve`), or now (:meth:`run`).

    The dispatcher owns the schedule (when the job is due, ticks dropped while
    it runs); the runner owns the job's task, which parks between runs, and
    everything about one run: its claim's lease and release, its timeout, its
    errors.
    """

    __slots__ = (
        "_cancel",
        "_catch_up",
        "_claims",
        "_clock",
        "_gate",
        "_keep",
        "_lease",
        "_logger",
        "_parent_logger",
        "_retry_wait",
        "_serving",
        "_task",
        "_tasks",
        "claimed_at",
        "due",
        "fence",
        "grid_us",
        "history",
        "in_flight",
        "job",
        "leases",
        "manual",
        "observers",
        "pause_unknown",
        "paused_until",
        "period_us",
        "stats",
        "stopping",
        "store",
        "thread_done",
        "woken",
    )

    def __init__(
        self,
        job: Job,
        clock: Clock,
        logger: logging.Logger,
        leases: LeaseKeeper | None = None,
        keep: int = HISTORY,
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
        self._claims: Claims | None = None
        self._tasks: Spawning | None = None
        self._serving = False  # its task is made (and has not ended)
        self._cancel: Callable[[], object] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._gate: Any = None  # what the parked task waits on: a Future (asyncio), an Event
        self.thread_done: threading.Event | None = None  # set when the sync job's thread returns
        schedule = job.schedule
        # Interval jobs step on their grid by integer microseconds; others (and
        # subclasses, which may move their ticks) ask the schedule.
        self.period_us = schedule.period_us if type(schedule) is Every else 0
        self.grid_us = 0
        # Set by the dispatcher:
        self.stopping = False
        self.in_flight = False
        """The dispatcher has taken a tick for this job (claiming, woken or running)."""
        self.woken = False
        self.due = 0.0
        """The tick of the run the dispatcher wakes the job for."""
        self.fence: int | None = None
        self.claimed_at = 0.0
        self.manual: Manual | None = None
        """The run asked for by hand that the task is woken for, if it is one."""
        self.paused_until = job.declared_pause
        """Ticks before this instant are skipped as paused (inf: until resumed)."""
        self.pause_unknown = False
        """The store's pauses are not read yet (an every_instance job, which no
        claim guards): its ticks are skipped (``paused_until`` is inf meanwhile)."""
        self.observers: Observers | None = None
        """Told about runs and skips; None (not an empty one) when there are none."""
        # Made on the first run; claimed runs are in the store's history instead.
        self.history: History | None = None
        self._keep = keep
        self._retry_wait: anyio.CancelScope | None = None
        self._catch_up: float | None = None  # the missed tick announced at start
        self._lease: Lease | None = None  # the claimed run's, while it goes

    @property
    def logger(self) -> logging.Logger:
        """``<scheduler logger>.<job name>``; made on first use (a logger per job
        is a lasting entry in logging's registry)."""
        if self._logger is None:
            self._logger = self._parent_logger.getChild(self.job.name)
        return self._logger

    # -- on the dispatcher's side ---------------------------------------------

    def arm(self, claims: Claims | None, tasks: Spawning) -> None:
        """Make ready to serve (a scheduler can be started more than once)."""
        self._claims, self._tasks = claims, tasks
        self.stopping = self.in_flight = self.woken = self._serving = False
        self.fence = self._catch_up = None

    def place(self, tick: float) -> None:
        """The job is due at ``tick``: :meth:`advance` steps on from there."""
        if self.period_us:
            self.grid_us = round(self.job.schedule.next_after(tick) * _US) - self.period_us

    def advance(self, tick: float) -> float:
        """The job's next tick after ``tick``, the instant it was due at."""
        period = self.period_us
        if period:
            self.grid_us = grid = self.grid_us + period
            return grid / _US
        return self.job.schedule.next_after(tick)

    def schedule_failed(self, exc: Exception) -> None:
        """The job's schedule raised: the job stops ticking (the others go on)."""
        self.stats.next_run_at = None
        self.logger.error(
            "job %r: its schedule failed (%r); the job stops ticking until the app restarts",
            self.job.name,
            exc,
            exc_info=exc,
            extra={"job": self.job.name},
        )

    def skip_missed(self, tick: float, now: float) -> tuple[float, float]:
        """Late at ``now`` for ``tick``: count the ticks missed; the latest due
        tick (to run) and the one after it."""
        schedule = self.job.schedule
        missed, latest = schedule.ticks_between(tick, now)
        if tick == self._catch_up:
            # The catch-up announced at start runs as announced, although the
            # next tick came due before the loop got to it (a stall right
            # after the announcement); the ticks due since count as missed.
            self._catch_up = None
            self.skipped("missed", schedule.next_after(tick), missed)
            self.place(latest)
            return tick, self.advance(latest)
        self.skipped("missed", tick, missed)
        self.place(latest)
        return latest, self.advance(latest)

    def skipped(self, reason: SkipReason, tick: float | None, count: int = 1) -> None:
        """``count`` ticks (from ``tick``) did not run here, for ``reason``."""
        if count <= 0:
            return
        self.stats.skip(reason, count)
        if self.observers is not None:
            self.observers.skipped(self.job.name, tick, reason, count)

    def wake(self) -> None:
        """Run the job for :attr:`due` (with :attr:`fence` if claimed). Once
        stopping, only a tick claimed before the stop runs (it is this instance's
        to run), and only while the job's task still serves."""
        if self.stopping and (self.fence is None or not self._serving):
            self.settle()
            return
        self.woken = True
        gate = self._gate
        if gate is not None:
            self._gate = None
            if self._task is not None:
                gate.set_result(None)
            else:
                gate.set()
        elif not self._serving:
            # First due: the job gets its task now (it sees `woken` and runs).
            self._serving = True
            assert self._tasks is not None
            self._tasks.spawn(self)

    def settle(self, *, cancel: bool = True) -> None:
        """The tick taken for this job will not run here: free the job again
        (and release the claim made for it, if any); if stopping, end its task
        (unless ``cancel`` is false: the task itself is ending)."""
        self.in_flight = self.woken = False
        manual = self.manual
        if manual is not None:
            self.manual = None
            manual.done.set()  # never ran: its ran stays None
        fence = self.fence
        if fence is not None:
            self.fence = None
            assert self._claims is not None
            # Never ran, so no run is recorded: this line is the claim's only trace.
            self.logger.info(
                "job %r: tick %s (fence %d) was claimed as the app stopped; released "
                "without running",
                self.job.name,
                datetime.fromtimestamp(self.due, UTC).isoformat(),
                fence,
                extra={"job": self.job.name},
            )
            self._claims.release_soon(Ended(self.job.name, fence, None, None, 0.0, 0))
        if cancel and self.stopping and self._cancel is not None:
            self._cancel()

    @property
    def busy(self) -> bool:
        """A run is taken or going, or the thread of an earlier one has not returned."""
        done = self.thread_done
        return self.in_flight or self.stats.running or (done is not None and not done.is_set())

    @property
    def thread_running(self) -> bool:
        """A thread of this job runs on after its run was cut or abandoned."""
        done = self.thread_done
        return not self.stats.running and done is not None and not done.is_set()

    # -- the job's task -----------------------------------------------------

    def bind(self, cancel: Callable[[], object], task: asyncio.Task[Any] | None) -> None:
        """Give the runner how to cancel the task (or scope) that serves it."""
        self._cancel, self._task = cancel, task

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The asyncio task that serves the job, while it does."""
        return self._task

    async def serve(self, state: Mapping[str, Any], dispatcher: Dispatching) -> None:
        """The job's task: park until woken, run, and again, until :meth:`stop`."""
        task = self._task
        loop = None if task is None else task.get_loop()
        try:
            if self.job.catch_up is not None:
                # Needs a round trip to the store: here, not in the scheduler's start.
                first = self._catch_up = await self._missed_tick(self.job.catch_up)
                if first is None:
                    first = self.first_tick(self._clock.now())
                if first is not None:
                    dispatcher.add(self, first)
            while not self.stopping:
                if not self.woken:
                    if loop is not None:
                        self._gate = gate = loop.create_future()
                        await gate
                    else:
                        self._gate = event = anyio.Event()
                        await event.wait()
                self.woken = False
                if self.stopping and self.fence is None:
                    self.settle(cancel=False)  # woken just before the stop: no new run
                    break
                manual, fence = self.manual, self.fence
                ran: Ran | None = None
                try:
                    if fence is None:
                        # self.attempts(), inlined: the hot path of a run.
                        tick = self.due
                        ran = await self.run(tick, state, manual=manual is not None)
                        if ran.outcome != "ok" and self.job.retries:
                            ran = await self._retry(ran, tick, state, manual is not None, None)
                        history = self.history
                        if history is not None:
                            history.add(tick, ran, manual is not None)
                        else:
                            self._remember(tick, manual, ran)
                    else:
                        self.fence = None
                        ran = await self._run_claimed(fence, state, manual)
                finally:
                    self.in_flight = False
                    if manual is not None:
                        self.manual = None
                        manual.ran = ran
                        manual.done.set()
        except BaseException as exc:
            if not (self.stopping and _is_cancellation(exc)):
                raise  # a cancellation from outside is never swallowed
            # Our own stop() or cut(): the task ends quietly.
        finally:
            self._cancel = self._task = self._gate = None
            self._serving = False
            self.stats.next_run_at = None

    def first_tick(self, now: float) -> float | None:
        """The tick the job is first due at when the scheduler starts at ``now``
        (None if its schedule fails: logged, and the job does not tick)."""
        job = self.job
        try:
            if job.run_on_startup:
                # Claimed jobs run the current period's tick, so that instances
                # starting together run it once between them.
                return now if self.store is None else job.schedule.last_at_or_before(now)
            return job.schedule.next_after(now)
        except Exception as exc:  # noqa: BLE001 - a schedule of the user's
            self.schedule_failed(exc)
            return None

    async def _missed_tick(self, deadline: float) -> float | None:
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
        # The time after the read: a slow store's round trip would otherwise
        # announce a tick that is no longer the latest.
        now = self._clock.now()
        missed, latest = self.job.schedule.ticks_between(last, now)
        if not missed:
            return None
        first = self.job.schedule.next_after(last)  # the first tick missed
        if now - latest > deadline:
            self.skipped("missed", first, missed)
            return None
        self.skipped("missed", first, missed - 1)
        self.logger.info(
            "job %r: %d tick(s) missed while down; catching up on the latest, %s",
            self.job.name,
            missed,
            datetime.fromtimestamp(latest, UTC).isoformat(),
            extra={"job": self.job.name},
        )
        return latest

    # -- claimed runs -------------------------------------------------------

    async def _run_claimed(
        self, fence: int, state: Mapping[str, Any], manual: Manual | None
    ) -> Ran | None:
        """Run the tick claimed for this job, under a renewed lease; release it.
        How it ended, or None if the run was cancelled (a lost lease)."""
        leases, claims, name = self.leases, self._claims, self.job.name
        assert leases is not None and claims is not None
        started = self._clock.now()
        ran: Ran | None = None  # None: cancelled
        task = self._task
        # A lost lease cancels the job's task on asyncio (cheaper than a scope
        # per run), the run's own scope elsewhere.
        scope = None if task is not None else anyio.CancelScope()
        cancel = task.cancel if task is not None else scope.cancel  # type: ignore[union-attr]
        lease = self._lease = leases.hold(name, fence, self.claimed_at, cancel, self.logger)
        try:
            if scope is None:
                ran = await self.attempts(self.due, state, manual, fence, started)
            else:
                with scope:  # absorbs the cancellation of a lost lease
                    ran = await self.attempts(self.due, state, manual, fence, started)
        except BaseException as exc:
            if lease.lost is None or self.stopping or not _is_cancellation(exc):
                raise
        finally:
            leases.end(lease)
            self._lease = None
            if lease.lost is not None:
                if task is not None:
                    task.uncancel()  # the keeper's cancel is spent
                if not lease.told:
                    self._lost_between_attempts(lease)
            # Cut at shutdown while its thread goes on, the claim stays held until
            # the lease runs out, so that no peer starts the job beside the thread.
            elif not self.thread_running:
                ended: tuple[str, int, Outcome, str | None, float, int, bool]
                if ran is None:
                    duration = max(0.0, self._clock.now() - started)
                    ended = (name, fence, "cancelled", None, duration, 1, manual is not None)
                else:
                    error = None if ran.error is None else str(ErrorInfo.of(ran.error))
                    attempts = ran.attempts
                    ended = (
                        name,
                        fence,
                        ran.outcome,
                        error,
                        ran.duration,
                        attempts,
                        manual is not None,
                    )
                claims.release_soon(_new(Ended, ended))
        return ran

    def _lost_between_attempts(self, lease: Lease) -> None:
        """The lease was lost while no attempt ran (waiting to retry): no run to
        record, and no more retries."""
        lease.told = True
        name = self.job.name
        if self.observers is not None:
            self.observers.lost(name, lease.fence, lease.lost or "")
        self.stats.last_error = LeaseLostError(f"lease lost: {lease.lost}; no more retries")
        self.logger.error(
            "job %r lost its lease (%s) while waiting to retry: no more retries",
            name,
            lease.lost,
            extra={"job": name},
        )

    def stop(self) -> None:
        """Stop: at once if idle, else after the run in flight (with no more retries)."""
        self.stopping = True
        if self._retry_wait is not None:
            self._retry_wait.cancel()
        if not self.in_flight and self._cancel is not None:
            self._cancel()

    def cut(self) -> None:
        """Cancel the run in flight (shutdown deadline passed)."""
        if self._cancel is not None:
            self._cancel()

    # -- a tick's runs: retries and history -----------------------------------

    async def attempts(
        self,
        tick: float,
        state: Mapping[str, Any],
        asked: Manual | None = None,
        fence: int | None = None,
        started: float | None = None,
    ) -> Ran:
        """Run the job for ``tick``, tried again on failure as the job says
        (``retries``), and remember how the tick went (:attr:`history`).
        ``asked``: the run was asked for by hand."""
        manual = asked is not None
        ran = await self.run(tick, state, manual=manual, fence=fence, started=started)
        if ran.outcome != "ok" and self.job.retries:
            ran = await self._retry(ran, tick, state, manual, fence)
        if fence is None:
            self._remember(tick, asked, ran)
        return ran

    def _remember(self, tick: float, asked: Manual | None, ran: Ran) -> None:
        history = self.history
        if history is None:
            if not self._keep:
                return
            history = self.history = History(self._keep)
        history.add(tick, ran, asked is not None)

    async def _retry(
        self, ran: Ran, tick: float, state: Mapping[str, Any], manual: bool, fence: int | None
    ) -> Ran:
        job, clock, name = self.job, self._clock, self.job.name
        first, attempt = ran.started, 1
        # No retry runs past the job's next tick, which runs as usual (also where
        # nothing ticks: the CLI's run). A retry starts only if it would end in
        # time at the pace of the attempt that failed, and an async one still
        # going is cut just before the tick (so the tick finds the job free).
        limit = self._next_tick(tick)
        cut = None if limit is None else limit - CUT_BEFORE_TICK
        while attempt <= job.retries and ran.outcome != "ok":
            if ran.outcome == "cancelled" or (
                ran.outcome == "timed_out" and not job.retry_timeouts
            ):
                break
            extra = {"job": name, "attempt": attempt}
            if self.stopping:
                self.logger.warning("job %r: not retried, the app is stopping", name, extra=extra)
                break
            at = clock.now() + backoff(job.retry_backoff, attempt)
            if cut is not None and at + ran.duration >= cut:
                self._retry_dropped(attempt, limit)
                break
            self.logger.warning(
                "job %r: attempt %d failed; retry %d of %d in %.3gs",
                name,
                attempt,
                attempt,
                job.retries,
                at - clock.now(),
                extra=extra,
            )
            try:
                with anyio.CancelScope() as self._retry_wait:
                    await clock.sleep_until(at)
            finally:
                self._retry_wait = None
            if self.stopping:
                break  # stop() cancelled the wait: the app is stopping
            if cut is not None and clock.now() >= cut:  # the wait ran late
                self._retry_dropped(attempt, limit)
                break
            attempt += 1
            self.stats.retries += 1
            ran = await self.run(
                tick, state, manual=manual, fence=fence, attempt=attempt, until=cut
            )
        finished = self.stats.last_finished_at or first
        duration = finished - first if finished > first else 0.0
        return _new(Ran, (ran.outcome, ran.error, duration, first, attempt))

    def _next_tick(self, tick: float) -> float | None:
        try:
            return self.job.schedule.next_after(tick)
        except Exception:  # noqa: BLE001 - the schedule's failure is the loop's to report
            return None

    def _retry_dropped(self, attempt: int, limit: float | None) -> None:
        self.logger.warning(
            "job %r: retry %d of %d dropped: it would not end before the job's next tick "
            "(%s), which runs as usual",
            self.job.name,
            attempt,
            self.job.retries,
            "?" if limit is None else datetime.fromtimestamp(limit, UTC).isoformat(),
            extra={"job": self.job.name, "attempt": attempt},
        )

    # -- one run ----------------------------------------------------------

    async def run(
        self,
        tick: float,
        state: Mapping[str, Any],
        *,
        manual: bool = False,
        fence: int | None = None,
        started: float | None = None,
        attempt: int = 1,
        until: float | None = None,
    ) -> Ran:
        """Run the job once, guarded: whatever the job raises is logged and
        recorded, never raised; a cancellation from outside the job (shutdown,
        timeout, lost lease, the caller) is recorded and re-raised. ``until``:
        an async run still going then is cut, as a timeout (a retry's bound)."""
        job, stats, clock = self.job, self.stats, self._clock
        if started is None:
            started = clock.now()
        timeout = job.timeout
        if until is not None and job.is_async and (timeout is None or until - started < timeout):
            timeout = max(0.0, until - started)
        else:
            until = None  # the job's own timeout comes first
        stats.running = True
        stats.runs += 1
        stats.last_started_at = started
        outcome: Outcome = "cancelled"
        error: BaseException | None = None
        observers = self.observers
        if observers is not None:
            asked = self.manual
            asked_from = None if asked is None or not manual else asked.asked_from
            observers.started(job.name, tick, started, attempt, manual, fence, asked_from)
        try:
            if not job.is_async:
                error = await self._call_sync(self._args(tick, state, manual, fence))
            elif timeout is not None:
                with anyio.move_on_after(timeout) as scope:
                    await job.func(*self._args(tick, state, manual, fence))
                if scope.cancel_called:
                    error = TimeoutError(
                        f"the run passed its timeout of {timeout:g}s"
                        if until is None
                        else "the retry was cut before the job's next tick, which runs as usual"
                    )
            elif job.takes_context:
                await job.func(self._context(tick, state, manual, fence))
            else:
                await job.func()
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
            stats.last_finished_at = finished = clock.now()
            # The wall clock may be stepped back mid-run (NTP): never below 0.
            duration = finished - started if finished > started else 0.0
            stats.running = False
            stats.last_duration = duration
            stats.last_outcome = outcome
            if outcome != "ok":
                self._report(outcome, error, duration)
            else:
                stats.ok += 1
                stats.last_ok_at = finished
                if self._parent_logger.isEnabledFor(_DEBUG):
                    self.logger.debug(
                        "job %r ran ok in %.3fs", job.name, duration, extra={"job": job.name}
                    )
            if observers is not None:
                observers.finished(
                    job.name, tick, started, attempt, manual, fence, outcome, duration, error
                )
        return _new(Ran, (outcome, error, duration, started, 1))  # Ran(...) without its __new__

    async def _call_sync(self, args: tuple[JobContext, ...]) -> TimeoutError | None:
        """Run the sync job in a worker thread; a TimeoutError if it passed its timeout.

        A thread cannot be interrupted. Past the timeout the run is reported at
        once and then waited for, so the job stays "running" (ticks drop as
        overlap, a claim's lease is kept) until its thread returns: never two
        copies at once. Cancelled from outside (shutdown, lost lease), the wait
        is abandoned, and :attr:`busy` stays true until the thread returns.
        """
        job, done = self.job, threading.Event()
        self.thread_done = done
        gate = _ThreadGate()

        def call() -> None:
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

        try:
            if job.timeout is None:
                await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
                return None
            with anyio.move_on_after(job.timeout):
                await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        except BaseException:
            # Cut while it waited for a worker thread (all of them busy): it will
            # never run, and must not leave the job "running" for good.
            if gate.abandon():
                done.set()
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
        self.logger.error(
            "job %r passed its timeout of %gs; its thread cannot be stopped and the "
            "job counts as running until it returns",
            job.name,
            job.timeout,
            extra={"job": job.name, "outcome": "timed_out"},
        )
        await anyio.to_thread.run_sync(done.wait, abandon_on_cancel=True)
        return TimeoutError(f"the run passed its timeout of {job.timeout:g}s")

    def _args(
        self, tick: float, state: Mapping[str, Any], manual: bool, fence: int | None
    ) -> tuple[JobContext, ...]:
        if self.job.takes_context:
            return (self._context(tick, state, manual, fence),)
        return ()

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
        """Count and log a run that did not end ok: the one place that does."""
        stats, name = self.stats, self.job.name
        extra = {"job": name, "outcome": outcome, "duration_s": duration}
        if outcome == "cancelled":
            stats.cancelled += 1
            lease = self._lease
            if lease is None or lease.lost is None:
                # Shutdown logs which jobs it cut; keep the previous error visible.
                self.logger.warning("job %r was cancelled after %.3fs", name, duration, extra=extra)
                return
            lease.told = True
            if self.observers is not None:  # before run_finished: a tracer's span is open
                self.observers.lost(name, lease.fence, lease.lost)
            stats.last_error = LeaseLostError(f"lease lost: {lease.lost}; the run was cancelled")
            self.logger.error(
                "job %r lost its lease (%s): run cancelled after %.3fs",
                name,
                lease.lost,
                duration,
                extra=extra,
            )
            return
        stats.failures += 1
        stats.last_error = error
        if outcome == "timed_out":
            stats.timeouts += 1
            note = "" if self.job.is_async else " (when its thread returned)"
            self.logger.error(
                "job %r timed out after %.3fs%s: %s", name, duration, note, error, extra=extra
            )
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
