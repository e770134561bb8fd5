"""The life of one job inside the scheduler: its task.

The job's task parks until the dispatcher wakes it for a tick (see
``_core.dispatcher``), runs the job, and parks again. A run is awaited in the task
itself: ticks that come while it goes are dropped (and counted by the
dispatcher), never queued, and no task is spawned per run.

`JobRunner` is built in layers, one concern per module, each adding
behaviour to the one below: the state the dispatcher reads and sets
(``_core.runner_state``), one guarded run (``_core.attempt``), a tick's runs, claimed,
retried and remembered (``_core.tick_runs``), and here the task that serves them.
How a run ended is ``_results``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import TickAheadError
from .._results import Manual, Ran, RunResult
from .._store import Ended
from .concurrency import is_cancellation
from .runner_state import HISTORY, Dispatching, Spawning
from .tick_runs import CUT_BEFORE_TICK, TickRuns, backoff

if TYPE_CHECKING:
    from .concurrency import TaskHandle

# Also importable from here, where the scheduler and its integrations look.
__all__ = [
    "CUT_BEFORE_TICK",
    "HISTORY",
    "Dispatching",
    "JobRunner",
    "Manual",
    "Ran",
    "RunResult",
    "Spawning",
    "backoff",
]


class JobRunner(TickRuns):
    """Runs one job: when the dispatcher wakes it (`serve`), or now (`run`).

    The dispatcher owns the schedule (when the job is due, ticks dropped while
    it runs); the runner owns the job's task, which parks between runs, and
    everything about one run: its claim's lease and release, its timeout, its
    errors.
    """

    __slots__ = ()

    def bind(self, handle: TaskHandle) -> None:
        """Give the runner the task that serves it (before the task runs)."""
        self._handle = handle

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The asyncio task that serves the job, while it does (on asyncio)."""
        return None if self._handle is None else self._handle.task

    async def serve(self, state: Mapping[str, Any], dispatcher: Dispatching) -> None:
        """The job's task: park until woken, run, and again, until `stop`."""
        handle = self._handle
        assert handle is not None, "bound by the backend before the task runs"
        new_gate = handle.new_gate  # a future on asyncio, an event elsewhere
        try:
            if self.job.catch_up is not None:
                # Needs a round trip to the store: here, not in the scheduler's start.
                first = self._catch_up = await self._missed_tick(self.job.catch_up)
                if first is None:
                    first = self.first_tick(self._clock.now())
                if first is not None:
                    dispatcher.add(self, first)
            replaceable = self.job.overlap == "replace"
            while not self.stopping:
                if not self.woken:
                    self._gate = gate = new_gate()
                    await gate
                self.woken = False
                if self.stopping and self.fence is None:
                    self.settle(cancel=False)  # woken just before the stop: no new run
                    break
                manual, fence = self.manual, self.fence
                ran: Ran | None = None
                try:
                    if replaceable:
                        ran = await self._replaceable(fence, state, manual)
                    elif fence is None:
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
                ran = manual = None  # else kept alive while parked (~0.1 KiB a job)
                if self.queued is not None:
                    await self._run_kept()
        except BaseException as exc:
            if not (self.stopping and is_cancellation(exc)):
                raise  # a cancellation from outside is never swallowed
            # Our own stop() or cut(): the task ends quietly.
        finally:
            self.drop_kept()  # behind a run that the stop cut
            self._handle = self._gate = None
            self._serving = False
            if not self.retired:  # else its stats are its successor's
                self.stats.next_run_at = None

    async def _replaceable(
        self, fence: int | None, state: Mapping[str, Any], manual: Manual | None
    ) -> Ran | None:
        """A run of an ``overlap="replace"`` job: in a scope that a newer tick
        cancels (`keep`); how it ended (cancelled by that tick: replaced)."""
        tick = self.due
        ran: Ran | None = None
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
            ran = Ran("cancelled", stats.last_error, duration, started, 1)
            self._remember(tick, manual, ran)
        return ran

    async def _run_kept(self) -> None:
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
        else:
            self.skipped("store_unavailable", tick)  # logged by claim()

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
