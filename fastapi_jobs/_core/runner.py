"""One job in a running scheduler: `JobRunner`, which owns the job's state,
its task and a tick's runs.

The dispatcher (``_core.dispatcher``) decides when a job is due and drops the
ticks that come while it runs. It, and the sides that run a job by hand
(``_core.manual_runs``, ``_backfill``), change a runner's state only through
its named methods, which run once per job per tick and stay cheap:

- `take` a tick (claiming, woken or running: no other tick starts meanwhile),
- `claimed` (the claim won: its fence) or `lost` (held elsewhere),
- `wake` the job's task for it, or `free` it (the tick will not run here),
- `hold_over` a tick that came while a run goes (``overlap``),
- `place` and `advance` on the job's schedule, `skipped` to count a tick.

The job's task (`serve`) parks until woken, runs the tick's `attempts` (each a
guarded run of ``_core.attempt``, the runner's collaborator), claimed ones under
the claim's lease, renewed while it goes and released when it ends, and parks
again. A run is awaited in the task itself: no task is spawned per run.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._clock import Clock, as_datetime
from .._errors import ScheduleChangedError, TickAheadError
from .._job import Job
from .._logging import job_logger
from .._policies import Jittered
from .._redaction import error_text
from .._results import Manual, RunEnd, SkipReason, lease_lost, replaced
from .._schedules import Every, Schedule
from .._status import ErrorInfo, JobStats
from .._store import Ended, Store
from .attempt import run_once
from .concurrency import is_cancellation
from .history import History
from .leases import Lease, LeaseKeeper

if TYPE_CHECKING:
    from .claims import Claims
    from .concurrency import Gate, Handle
    from .observers import Observers

__all__ = ["CUT_BEFORE_TICK", "HISTORY", "Dispatching", "JobRunner", "Spawning", "backoff"]

_new = tuple.__new__
_US = 1_000_000
_GRIDS = (Every, Jittered)  # the schedules whose ticks step on a grid of integer µs

HISTORY = 50
"""Runs of each unclaimed job this process remembers, by default (``Scheduler(history=)``)."""

CUT_BEFORE_TICK = 0.01
"""A retry still going this long before the job's next tick is cut: the timer
may fire a millisecond early, and must find the job free (an earlier deadline
is handled first by the event loop, even one blocked past both)."""


def backoff(base: float, attempt: int) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): ``base`` doubled each time,
    between half of that and all of it (jitter, so that jobs failing together do
    not retry together)."""
    delay = base * 2.0 ** min(attempt - 1, 60)
    return random.uniform(delay / 2, delay)


class Dispatching(Protocol):
    """What a job's task needs of the dispatcher (``_core.dispatcher.Dispatcher``)."""

    def add(self, runner: JobRunner, tick: float) -> None: ...

    def claim_now(self, runner: JobRunner, tick: float) -> None: ...


class Spawning(Protocol):
    """What a runner needs of the owner of the jobs' tasks (``_core.tasks.JobTasks``)."""

    state: Mapping[str, Any]
    """What the runs are given: the app's lifespan state."""
    dispatcher: Dispatching

    def spawn(self, runner: JobRunner) -> None: ...


class JobRunner:
    """Runs one job: when the dispatcher wakes it (`serve`), or now (`attempts`).

    The dispatcher owns the schedule (when the job is due, ticks dropped while
    it runs); the runner owns the job's state, its task, which parks between
    runs, and everything about one tick's runs: its claim's lease and release,
    its retries, its history here.
    """

    __slots__ = (
        "_catch_up",
        "_claim_again",
        "_claims",
        "_gate",
        "_handle",
        "_keep",
        "_logger",
        "_retry_wait",
        "_scope",
        "_serving",
        "_tasks",
        "claimed_at",
        "clock",
        "due",
        "fence",
        "grid_us",
        "grouped",
        "history",
        "in_flight",
        "job",
        "lease",
        "leases",
        "manual",
        "observers",
        "parent_logger",
        "pause_unknown",
        "paused_until",
        "period_us",
        "queued",
        "replaced_by",
        "retired",
        "stats",
        "stopping",
        "successor",
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
        observers: Observers | None = None,
    ) -> None:
        self.job = job
        self.stats = JobStats()
        self.leases = None if job.every_instance else leases
        """Keeps the leases of claimed runs; None: every instance runs every tick."""
        self.clock = clock  # the clock the job ticks on (the database's time, with a store)
        self.parent_logger = logger
        self._logger: logging.Logger | None = None
        self.observers = observers or None
        """Told about runs and skips; None (not an empty one) when there are none."""
        self._claims: Claims | None = None
        self._tasks: Spawning | None = None
        self._serving = False  # its task is made (and has not ended)
        self._handle: Handle | None = None  # its task, while it serves
        self._gate: Gate | None = None  # what the parked task waits on
        self.thread_done: threading.Event | None = None  # set when a sync run's thread returns
        schedule = job.schedule
        # Interval jobs step on their grid by integer microseconds; others (and
        # subclasses, which may move their ticks) ask the schedule.
        self.period_us = schedule.period_us if type(schedule) in _GRIDS else 0  # type: ignore[attr-defined]
        # A float holding whole µs (exact below 2**53 µs, the year 2255): a new
        # int each tick would be one of 48 bytes a job, a float is one of 32.
        self.grid_us = 0.0
        self.retired = self.stopping = self.woken = False  # retired: see `take_over`
        self.successor: JobRunner | None = None  # what a retired runner hands its tick to
        self.in_flight = False
        """A tick is taken for this job (claiming, woken or running): `take`."""
        self.due = 0.0
        """The tick of the run the task is woken for."""
        self.fence: int | None = None
        """The claim's fence of the tick taken, once `claimed`."""
        self.claimed_at, self.grouped = 0.0, False  # grouped: see `arm`
        self.manual: Manual | None = None
        """The run asked for by hand that the task is woken for, if it is one."""
        self.queued: float | None = None
        """A tick that came during the run in flight, kept to run after it (`hold_over`)."""
        self.replaced_by: float | None = None
        """The tick that cancelled the run in flight (``overlap="replace"``)."""
        self._scope: anyio.CancelScope | None = None  # a replaceable run's
        self.paused_until = job.declared_pause
        """Ticks before this instant are skipped as paused (inf: until resumed)."""
        self.pause_unknown = False
        """The store's pauses are not read yet (an every_instance job, which no
        claim guards): its ticks are skipped (``paused_until`` is inf meanwhile)."""
        # Made on the first run; claimed runs are in the store's history instead.
        self.history: History | None = None
        self._keep = keep
        self._retry_wait: anyio.CancelScope | None = None  # a retry's wait, which stop() ends
        self._catch_up: float | None = None  # the missed tick announced at start
        self._claim_again: float | None = None  # see `_claim_after_handed`
        self.lease: Lease | None = None  # the claimed run's, while it goes

    @property
    def store(self) -> Store | None:
        """Where ticks are claimed (the keeper's store), or None. Read through
        the keeper: a slot less in every runner."""
        leases = self.leases
        return None if leases is None else leases.store

    @property
    def logger(self) -> logging.Logger:
        """``<scheduler logger>.<job name>``, made on first use, and kept by this
        runner rather than in logging's registry (`job_logger`)."""
        logger = self._logger = job_logger(self.parent_logger, self.job.name, self._logger)
        return logger

    # -- its place among the scheduler's parts ---------------------------------

    def arm(self, claims: Claims | None, tasks: Spawning) -> None:
        """Make ready to serve (a scheduler can be started more than once)."""
        self._claims, self._tasks = claims, tasks
        job = self.job
        if claims is not None and self.leases is not None and job.overlap == "replace":
            claims.replacing.add(job.name)
        if claims is not None and self.leases is not None and job.enqueue is not None:
            claims.handing_off.add(job.name)
        # Claimed with the set of jobs due at the same instant (``_core.claims``'s
        # `instant`): a job claimed by tick, whose ticks never wait for a run
        # (overlap "skip"), and that hands nothing off (the losers of its claim
        # watch the tick, in case its claimer dies before handing it off).
        self.grouped = (
            claims is not None
            and self.leases is not None
            and job.overlap == "skip"
            and job.enqueue is None
        )
        self.stopping = self.in_flight = self.woken = self._serving = False
        self.fence = self._catch_up = self.queued = self.replaced_by = None

    def afresh(self) -> None:
        """Forget what ran and what was counted, and any pause but the declared
        one: the job as declared (a test that runs the app's own scheduler
        again, on other clocks and stores: ``fastapi_jobs.testing.virtual``)."""
        self.stats, self.history = JobStats(), None
        self.paused_until, self.pause_unknown = self.job.declared_pause, False

    def bind(self, handle: Handle) -> None:
        """Give the runner the task that serves it (before the task runs)."""
        self._handle = handle

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The asyncio task that serves the job, while it does (on asyncio)."""
        handle = self._handle
        return handle if isinstance(handle, asyncio.Task) else None

    def watched_by(self, observers: Observers) -> None:
        """Tell ``observers`` about this job's runs and skips (none: if empty)."""
        self.observers = observers or None

    def take_over(self, old: JobRunner) -> None:
        """Go on as ``old``'s job, under a changed schedule: its counts, its
        history, its thread and an operator's pause are this runner's now; it
        is ``retired`` and ends after its run in flight, and a tick it took
        before the change is this runner's to run if the change kept it
        (its ``successor``: `handed`). (A removal retires a runner with none.)"""
        self.stats, self.history, self.thread_done = old.stats, old.history, old.thread_done
        self._logger = old._logger  # the app's setLevel on ctx.logger holds
        if old.paused_until != old.job.declared_pause or old.pause_unknown:
            # Paused or resumed by an operator (or not known yet): still so.
            # Else the new spec's own default holds (``paused=`` changed).
            self.paused_until, self.pause_unknown = old.paused_until, old.pause_unknown
        old.retired = True  # its stats are this runner's from now on
        old.successor = self
        old.stop()  # after its run in flight

    # -- its pause ---------------------------------------------------------------

    def pause(self, until: float) -> None:
        """Skip the ticks before ``until`` (0: resumed; inf: until resumed)."""
        self.paused_until = until

    def pause_unread(self) -> None:
        """The store's pauses are not read yet: skip every tick until they are
        (an every_instance job, which no claim guards, fails closed)."""
        self.pause_unknown, self.paused_until = True, float("inf")

    def pause_read(self) -> None:
        """The store's pauses were read: the job's own default holds, until a
        row of the reading says otherwise."""
        if self.pause_unknown:
            self.pause_unknown = False
            self.paused_until = self.job.declared_pause

    # -- its schedule --------------------------------------------------------------

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

    def place(self, tick: float) -> None:
        """The job is due at ``tick``: `advance` steps on from there."""
        if self.period_us:
            self.grid_us = float(round(self.job.schedule.next_after(tick) * _US) - self.period_us)

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

    # -- a tick: taken, claimed or lost, woken or freed ------------------------------

    def take(self, tick: float, manual: Manual | None = None) -> None:
        """Take ``tick`` for this job: no other tick starts here until it is
        run or `free`. ``manual``: a run asked for by hand."""
        self.due, self.in_flight = tick, True
        if manual is not None:
            self.manual = manual

    def claimed(self, fence: int, at: float) -> None:
        """The tick taken is claimed, with ``fence``; its lease counts from ``at``
        (the loop's time the claim was sent)."""
        self.fence, self.claimed_at = fence, at

    def lost(self) -> None:
        """The tick taken was claimed by another instance (or its previous one
        is still held): freed, and counted. Every instance but one comes here for
        every job of an instant, so the common case is short."""
        if (
            self.fence is None
            and self.manual is None
            and self.observers is None
            and not self.stopping
            and self._claim_again is None
        ):
            self.in_flight = self.woken = False
            self.stats.skip("claimed_elsewhere", 1)
            return
        if self._claim_again is not None:
            again, self._claim_again = self._claim_again, None
            if again == self.due and not self.stopping and self._tasks is not None:
                # Refused under the predecessor's claim, given back since: the
                # release goes before this claim, in the same call.
                self._tasks.dispatcher.claim_now(self, again)
                return
        self.free()
        self.skipped("claimed_elsewhere", self.due)

    def wake(self) -> None:
        """Run the job for `due` (with `fence` if claimed). Once
        stopping, only a tick claimed before the stop runs (it is this instance's
        to run), and only while the job's task still serves. A runner `retired`
        (its stored schedule changed or removed) starts no run: its claim may
        have gone out as the change was applied here, without the version that
        would have made the store refuse it; the tick is given back unrun."""
        if self.stopping and (self.fence is None or not self._serving or self.retired):
            if self.retired and self.fence is not None:
                self._hand_over()
            else:
                self.free()
            return
        self.woken = True
        gate = self._gate
        if gate is not None:
            self._gate = None
            gate.set_result(None)
        elif not self._serving:
            # First due: the job gets its task now (it sees `woken` and runs).
            self._serving = True
            assert self._tasks is not None
            self._tasks.spawn(self)

    def free(self, *, cancel: bool = True) -> None:
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
                "job %r: tick %s (fence %d) was claimed as the app stopped%s; released "
                "without running",
                self.job.name,
                as_datetime(self.due).isoformat(),
                fence,
                " or its schedule changed" if self.retired else "",
                extra={"job": self.job.name},
            )
            self._claims.release_soon(Ended(self.job.name, fence, None, None, 0.0, 0))
        if cancel and self.stopping and self._handle is not None:
            self._handle.cancel()

    def changed_under(self) -> None:
        """The tick taken was refused: the store has another version of the
        job's schedule (changed, or removed, on another instance since this one
        read it). Freed; the change is read at once, and the runner of its new
        version runs the tick if the change kept it (`handed`)."""
        tick, successor = self.due, self.heir()
        self.free()
        if successor is not None:  # the change is read here already
            successor.handed(tick, None)
            return
        assert self._claims is not None
        older = self._claims.changed_under(self.job.name, tick)
        if older is not None:
            self.changed_away(older, "a later tick of it was refused too")
        self.logger.info(
            "job %r: its schedule changed since this instance read it, so its tick %s "
            "was not claimed under the old version; reading the change now",
            self.job.name,
            as_datetime(tick).isoformat(),
            extra={"job": self.job.name},
        )

    def _hand_over(self) -> None:
        """Retired with a claim made before the change and not run (woken after
        it): the claim goes to the successor, if any, to run under the new
        version; else it is released unrun."""
        successor, fence, tick = self.heir(), self.fence, self.due
        if successor is None or fence is None:
            self.free()
            if successor is None:
                self.changed_away(tick, "the schedule was removed")
            return
        self.fence, self.in_flight, self.woken = None, False, False
        successor.handed(tick, fence, self.claimed_at, self.job.schedule)

    def heir(self) -> JobRunner | None:
        """The runner of the job's current version: the successor's successor,
        and so on, if it changed again meanwhile; None if it was removed."""
        successor = self.successor
        while successor is not None and successor.retired:
            successor = successor.successor
        return successor

    def handed(
        self,
        tick: float,
        fence: int | None,
        claimed_at: float = 0.0,
        old: Schedule | None = None,
    ) -> None:
        """``tick``, taken by the runner this one replaced (the job's schedule
        changed as it went), is this runner's: run here under the new version if
        the change kept it (a tick of this schedule, and no later one due), with
        ``fence`` if its claim was made, else claimed now; otherwise counted as
        skipped (``schedule_changed``) and its claim, if made, released unrun
        (``old``: the schedule it was claimed under, see `_claim_after_handed`)."""
        tasks = self._tasks
        why = "the job is busy" if self.in_flight or self.stopping else self._drops(tick)
        if tasks is not None and why is None:
            self.logger.info(
                "job %r: tick %s runs under the schedule's new version",
                self.job.name,
                as_datetime(tick).isoformat(),
                extra={"job": self.job.name},
            )
            if fence is None:
                tasks.dispatcher.claim_now(self, tick)
                return
            self.take(tick)
            self.claimed(fence, claimed_at)
            self.wake()
            return
        if fence is not None:
            assert self._claims is not None
            self._claims.release_soon(Ended(self.job.name, fence, None, None, 0.0, 0))
        self.changed_away(tick, why or "the scheduler is stopping")
        if fence is not None and tasks is not None and not self.stopping:
            self._claim_after_handed(tasks, tick, old)

    def _claim_after_handed(self, tasks: Spawning, handed: float, old: Schedule | None) -> None:
        """A claim handed over unrun (a later tick of this version is due, or
        this runner's own is taken) is given back: the claims of the ticks due
        meanwhile, here and on every peer, were refused while it held the job's
        row, so none of them runs unless claimed again. The latest due is, once:
        now if the job is free; if this runner's own claim is on its way, once
        more should the store refuse it (`lost`). Only a tick someone claimed:
        this runner's own (its `due`), or one of the version claimed under
        (``old``); not one of a new version that came due before it existed.
        (No tick after ``handed`` was claimed by anyone since: the store refuses
        a claim older than its row's, so the handed claim would not have been
        made; but a ``replace`` job's claim takes a held row over, so its
        tick may have run.)"""
        if self.job.overlap == "replace":
            return
        if self.in_flight:
            if self.fence is None and self.manual is None and not self.woken:
                self._claim_again = self.due
            return
        try:
            latest = self.job.schedule.last_at_or_before(self.clock.now())
            claimed = latest == self.due or (
                old is not None and old.last_at_or_before(latest) == latest
            )
        except Exception:  # noqa: BLE001 - a schedule of the user's (`_drops` said so)
            return
        if claimed and handed < latest and latest >= self.paused_until:
            tasks.dispatcher.claim_now(self, latest)

    def changed_away(self, tick: float, why: str) -> None:
        """``tick``, taken under a version of the job's stored schedule that
        changed under it, does not run (``why``): counted, and said."""
        self.skipped("schedule_changed", tick)
        self.logger.info(
            "job %r: tick %s was not run: its schedule changed, and %s",
            self.job.name,
            as_datetime(tick).isoformat(),
            why,
            extra={"job": self.job.name},
        )

    def _drops(self, tick: float) -> str | None:
        """Why the change does not keep ``tick``: it is no tick of this runner's
        schedule, or a later one of it is due already; None if it keeps it."""
        try:
            latest = self.job.schedule.last_at_or_before(max(tick, self.clock.now()))
        except Exception:  # noqa: BLE001 - a schedule of the user's (or without that method)
            return "its new version cannot say"
        if latest == tick:
            return None
        return (
            "a later tick of its new version is due"
            if latest > tick
            else "its new version has no tick then"
        )

    def hold_over(self, tick: float) -> bool:
        """``tick`` came while the job is busy: keep it to run after the run in
        flight, as the job's ``overlap`` says; False if it is dropped. Only a run
        that goes in the job's task is followed (not a claim on its way, nor a
        thread left running after its run was cut)."""
        if not self.stats.running or self.stopping or self._handle is None:
            return False
        if self.job.overlap == "queue_one":
            if self.queued is not None:
                return False  # one is kept already
            self.queued = tick
            return True
        if self.queued is not None:  # replace: the newest tick replaces a kept one too
            self.skipped("overlap", self.queued)
        self.queued = tick
        if self.replaced_by is None and self._scope is not None:
            self.replaced_by = tick
            self._scope.cancel()
        return True

    def drop_held_over(self) -> None:
        """The tick kept for after the run will not run (the app stops): counted."""
        if self.queued is not None:
            self.skipped("overlap", self.queued)
            self.queued = self.replaced_by = None

    @property
    def busy(self) -> bool:
        """A run is taken or going, or the thread of an earlier one has not returned."""
        done = self.thread_done
        return self.in_flight or self.stats.running or (done is not None and not done.is_set())

    @property
    def holds_claim(self) -> bool:
        """This instance holds a claim of the job that it knows of: answered and
        not yet run (``fence``), or under a run's lease. Not a claim whose answer
        is still on its way, nor a run asked for by hand without a claim, nor a
        thread left behind by a run whose lease ended."""
        return self.fence is not None or self.lease is not None

    @property
    def thread_running(self) -> bool:
        """A thread of this job runs on after its run was cut or abandoned."""
        done = self.thread_done
        return not self.stats.running and done is not None and not done.is_set()

    # -- its task ------------------------------------------------------------------

    async def serve(self, new_gate: Callable[[], Gate]) -> None:
        """The job's task: park until woken, run, and again, until `stop`.
        ``new_gate``: what it parks on (a future on asyncio, an event elsewhere)."""
        assert self._handle is not None, "bound by the backend before the task runs"
        # Three locals: this frame is kept alive, parked, by every job (0.07
        # KiB a job less than with the run's own in it: `_start_run`; even the
        # exception is not named, as its slot is in the frame too).
        try:
            if self.job.catch_up is not None:
                await self._catch_up_first()
            while not self.stopping:
                if not self.woken:
                    self._gate = gate = new_gate()
                    await gate
                self.woken = False
                if self.stopping and self.fence is None:
                    self.free(cancel=False)  # woken just before the stop: no new run
                    break
                try:
                    await self._start_run()
                finally:
                    self.in_flight = False
                if self.queued is not None:
                    await self._run_held_over()
        except BaseException:
            if not self._stopped_quietly():
                raise  # a cancellation from outside is never swallowed
            # Our own stop() or cut(): the task ends quietly.
        finally:
            self._served()

    def _served(self) -> None:
        """The job's task ends (a method: the frame that stays parked is smaller)."""
        self.drop_held_over()  # behind a run that the stop cut
        self._handle = self._gate = None
        self._serving = False
        if not self.retired:  # else its stats are its successor's
            self.stats.next_run_at = None

    async def _catch_up_first(self) -> None:
        """Announce the missed tick to run first (or the first tick), which
        needs a round trip to the store: in the task, not in the scheduler's start."""
        assert self.job.catch_up is not None and self._tasks is not None
        first = self._catch_up = await self._missed_tick(self.job.catch_up)
        if first is None:
            first = self.first_tick(self.clock.now())
        if first is not None:
            self._tasks.dispatcher.add(self, first)

    def _stopped_quietly(self) -> bool:
        """The task ends by our own stop() or cut(), not by a failure or a
        cancellation from outside (asked while the exception is handled)."""
        exc = sys.exc_info()[1]
        return self.stopping and exc is not None and is_cancellation(exc)

    def _start_run(self) -> Coroutine[Any, Any, RunEnd | None]:
        """The run the task is woken for, not yet awaited: no coroutine more
        per scheduled run (a run asked for by hand gets one, `_asked`)."""
        assert self._tasks is not None
        state, fence, manual = self._tasks.state, self.fence, self.manual
        if self.job.overlap == "replace":
            run = self._replaceable(fence, state, manual)
        elif fence is None:
            run = self.attempts(self.due, state, manual)
        else:
            self.fence = None
            run = self._run_claimed(fence, state, manual)
        return run if manual is None else self._asked(manual, run)

    async def _asked(
        self, manual: Manual, run: Coroutine[Any, Any, RunEnd | None]
    ) -> RunEnd | None:
        """A run asked for by hand: its asker is told how it ended."""
        ran: RunEnd | None = None
        try:
            ran = await run
        finally:
            self.in_flight = False
            self.manual = None
            manual.ran = ran
            manual.done.set()
        return ran

    def stop(self) -> None:
        """Stop: at once if idle, else after the run in flight (with no more retries)."""
        self.stopping = True
        if self._retry_wait is not None:
            self._retry_wait.cancel()
        if not self.in_flight and self._handle is not None:
            self._handle.cancel()

    def cut(self) -> None:
        """Cancel the run in flight (shutdown deadline passed)."""
        if self._handle is not None:
            self._handle.cancel()

    # -- a tick's runs -----------------------------------------------------------------

    async def attempts(
        self,
        tick: float,
        state: Mapping[str, Any],
        asked: Manual | None = None,
        fence: int | None = None,
        started: float | None = None,
    ) -> RunEnd:
        """Run the job for ``tick``, tried again on failure as the job says
        (``retries``), and remember how the tick went (`history`; a claimed
        run, with ``fence``, is in the store's). ``asked``: the run was asked
        for by hand. The one body of a tick's runs: every run comes here."""
        manual = asked is not None
        ran = await run_once(self, tick, state, manual, fence, started)
        if ran.outcome != "ok" and self.job.retries:
            ran = await self._retry(ran, tick, state, manual, fence)
        if fence is None:
            history = self.history
            if history is not None:  # _remember(), its common case inlined: each run
                history.add(tick, ran, manual)
            else:
                self._remember(tick, ran, manual)
        return ran

    def _remember(self, tick: float, ran: RunEnd, manual: bool) -> None:
        """Keep the run of ``tick`` in this process's history (made at the first)."""
        if not self._keep:
            return
        if self.history is None:
            self.history = History(self._keep)
        self.history.add(tick, ran, manual)

    async def _retry(
        self, ran: RunEnd, tick: float, state: Mapping[str, Any], manual: bool, fence: int | None
    ) -> RunEnd:
        job, clock, name = self.job, self.clock, self.job.name
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
            ran = await run_once(self, tick, state, manual, fence, None, attempt, cut)
        finished = self.stats.last_finished_at or first
        duration = finished - first if finished > first else 0.0
        return _new(RunEnd, (ran.outcome, ran.error, duration, first, attempt))

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
            "?" if limit is None else as_datetime(limit).isoformat(),
            extra={"job": self.job.name, "attempt": attempt},
        )

    async def _run_claimed(
        self, fence: int, state: Mapping[str, Any], manual: Manual | None
    ) -> RunEnd | None:
        """Run the tick claimed for this job, under a renewed lease; release it.
        How it ended, or None if the run was cancelled (a lost lease)."""
        leases, claims, name = self.leases, self._claims, self.job.name
        assert leases is not None and claims is not None
        started = self.clock.now()
        ran: RunEnd | None = None  # None: cancelled
        handle = self._handle
        assert handle is not None, "a claimed run is run by the job's task"
        # A lost lease cancels the job's task where that can be taken back
        # (asyncio: cheaper than a scope per run), the run's own scope elsewhere.
        scope = None if isinstance(handle, asyncio.Task) else anyio.CancelScope()
        cancel = handle.cancel if scope is None else scope.cancel
        lease = self.lease = leases.hold(name, fence, self.claimed_at, cancel, self.logger)
        past = self.due if manual is not None and manual.past else None
        try:
            if scope is None:
                ran = await self.attempts(self.due, state, manual, fence, started)
            else:
                with scope:  # absorbs the cancellation of a lost lease
                    ran = await self.attempts(self.due, state, manual, fence, started)
        except BaseException as exc:
            if lease.lost is None or self.stopping or not is_cancellation(exc):
                raise
        finally:
            leases.end(lease)
            self.lease = None
            if lease.lost is not None:
                if isinstance(handle, asyncio.Task):
                    handle.uncancel()  # the keeper's cancel is spent
                if not lease.told:
                    self._lost_between_attempts(lease)
            # Cut at shutdown while its thread goes on, the claim stays held until
            # the lease runs out, so that no peer starts the job beside the thread.
            elif self.thread_done is None or not self.thread_running:
                if ran is None:
                    ended = self._cancelled(fence, started, manual is not None, past)
                else:
                    ended = ran.release(name, fence, manual is not None, past)
                claims.release_soon(ended)
        return ran

    def _cancelled(self, fence: int, started: float, manual: bool, past: float | None) -> Ended:
        """The release of a claimed run cancelled from outside (the app's stop,
        or a newer tick that replaced it)."""
        duration = max(0.0, self.clock.now() - started)
        by = self.replaced_by  # else cut by the app's stop
        error = None if by is None else error_text(replaced(by))
        return _new(Ended, (self.job.name, fence, "cancelled", error, duration, 1, manual, past))

    def _lost_between_attempts(self, lease: Lease) -> None:
        """The lease was lost while no attempt ran (waiting to retry): no run to
        record, and no more retries."""
        lease.told = True
        name = self.job.name
        if self.observers is not None:
            self.observers.lost(name, lease.fence, lease.lost or "")
        self.stats.last_error = ErrorInfo.of(lease_lost(lease.lost or "", while_running=False))
        self.logger.error(
            "job %r lost its lease (%s) while waiting to retry: no more retries",
            name,
            lease.lost,
            extra={"job": name},
        )

    async def _replaceable(
        self, fence: int | None, state: Mapping[str, Any], manual: Manual | None
    ) -> RunEnd | None:
        """A run of an ``overlap="replace"`` job: in a scope that a newer tick
        cancels (`hold_over`); how it ended (cancelled by that tick: replaced)."""
        tick = self.due
        ran: RunEnd | None = None
        try:
            with anyio.CancelScope() as self._scope:
                if fence is None:
                    ran = await self.attempts(tick, state, manual)
                else:
                    self.fence = None
                    ran = await self._run_claimed(fence, state, manual)
        finally:
            self._scope = None
        if self.replaced_by is not None and ran is not None and ran.outcome != "cancelled":
            # It caught the cancellation (or shielded itself) and ended by itself.
            self.logger.warning(
                "job %r: its run did not stop when a newer tick replaced it; that tick runs now",
                self.job.name,
                extra={"job": self.job.name},
            )
        if ran is None and self.replaced_by is not None and fence is None:
            # Recorded by the guarded run; remembered in this process's history too.
            stats = self.stats
            duration, started = stats.last_duration or 0.0, stats.last_started_at or 0.0
            ran = RunEnd("cancelled", replaced(self.replaced_by), duration, started, 1)
            self._remember(tick, ran, manual is not None)
        return ran

    async def _run_held_over(self) -> None:
        """Run the tick kept during the run that just ended (``queue_one``, or
        the tick that replaced it): now, claimed first with a store (the release
        of the run before goes first: ``_core.claims``). Dropped if the app stops."""
        tick, self.queued, self.replaced_by = self.queued, None, None
        assert tick is not None
        if self.stopping:
            self.skipped("overlap", tick)
            return
        self.due = tick
        if self.leases is None:
            self.in_flight = self.woken = True
            return
        claims = self._claims
        assert claims is not None
        self.in_flight = True
        claimed_at, sent = anyio.current_time(), claims.reading()
        fences = await claims.claim([(self.job.name, tick)])
        fence = None if isinstance(fences, Exception) else fences.get(self.job.name)
        if isinstance(fence, int) and not self.stopping:
            self.fence, self.claimed_at, self.woken = fence, claimed_at, True
            return
        self.in_flight = False
        if isinstance(fence, int):  # the app began to stop while it claimed
            claims.release_soon(Ended(self.job.name, fence, None, None, 0.0, 0))
            self.skipped("overlap", tick)
        elif fence is None and not isinstance(fences, Exception):
            self.skipped("claimed_elsewhere", tick)
        elif isinstance(fence, TickAheadError):
            claims.heard(fence, sent, [self.job.name])
            self.skipped("ahead_of_database", tick)
        elif isinstance(fence, ScheduleChangedError):
            self.changed_under()
        else:
            self.skipped("store_unavailable", tick)  # logged by claim()

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
        now = self.clock.now()
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
            as_datetime(latest).isoformat(),
            extra={"job": self.job.name},
        )
        return latest
