"""A tick's runs: the claimed run under its lease, retries, and the history.

Where the guarded run (``_core.attempt``) runs the job once, a tick may take
several attempts (``retries``, with a jittered backoff, never past the job's
next tick) and, with a store, is run under the claim's lease, renewed while
it goes and released when it ends (``Ended``, queued to ``_core.claims``). An
unclaimed tick's runs are remembered in this process (``_core.history``); a
claimed one's are in the store's history instead.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import anyio

from .._results import Manual, Ran, lease_lost, replaced
from .._status import ErrorInfo
from .._store import Ended
from .attempt import GuardedRun
from .concurrency import is_cancellation
from .history import History
from .leases import Lease

__all__ = ["CUT_BEFORE_TICK", "TickRuns", "backoff"]

_new = tuple.__new__
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


class TickRuns(GuardedRun):
    """A runner's runs of one tick: `attempts`, and the claimed run."""

    __slots__ = ()

    async def attempts(
        self,
        tick: float,
        state: Mapping[str, Any],
        asked: Manual | None = None,
        fence: int | None = None,
        started: float | None = None,
    ) -> Ran:
        """Run the job for ``tick``, tried again on failure as the job says
        (``retries``), and remember how the tick went (`history`).
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

    async def _run_claimed(
        self, fence: int, state: Mapping[str, Any], manual: Manual | None
    ) -> Ran | None:
        """Run the tick claimed for this job, under a renewed lease; release it.
        How it ended, or None if the run was cancelled (a lost lease)."""
        leases, claims, name = self.leases, self._claims, self.job.name
        assert leases is not None and claims is not None
        started = self._clock.now()
        ran: Ran | None = None  # None: cancelled
        handle = self._handle
        assert handle is not None, "a claimed run is run by the job's task"
        # A lost lease cancels the job's task where that can be taken back
        # (asyncio: cheaper than a scope per run), the run's own scope elsewhere.
        scope = anyio.CancelScope() if handle.scoped else None
        cancel = handle.cancel if scope is None else scope.cancel
        lease = self._lease = leases.hold(name, fence, self.claimed_at, cancel, self.logger)
        past = self.due if manual is not None and manual.past else None
        try:
            if scope is None:
                # self.attempts(), inlined: the hot path of a claimed run.
                tick, asked = self.due, manual is not None
                ran = await self.run(tick, state, manual=asked, fence=fence, started=started)
                if ran.outcome != "ok" and self.job.retries:
                    ran = await self._retry(ran, tick, state, asked, fence)
            else:
                with scope:  # absorbs the cancellation of a lost lease
                    ran = await self.attempts(self.due, state, manual, fence, started)
        except BaseException as exc:
            if lease.lost is None or self.stopping or not is_cancellation(exc):
                raise
        finally:
            leases.end(lease)
            self._lease = None
            if lease.lost is not None:
                if scope is None:
                    handle.uncancel()  # the keeper's cancel is spent
                if not lease.told:
                    self._lost_between_attempts(lease)
            # Cut at shutdown while its thread goes on, the claim stays held until
            # the lease runs out, so that no peer starts the job beside the thread.
            elif self.thread_done is None or not self.thread_running:
                claims.release_soon(self._ended(fence, ran, started, manual is not None, past))
        return ran

    def _ended(
        self, fence: int, ran: Ran | None, started: float, manual: bool, past: float | None
    ) -> Ended:
        """How the claimed run ``ran`` ended, for its release (None: cancelled)."""
        if ran is None:
            duration = max(0.0, self._clock.now() - started)
            by = self.replaced_by  # else cut by the app's stop
            error = None if by is None else str(ErrorInfo.of(replaced(by)))
            ended = (self.job.name, fence, "cancelled", error, duration, 1, manual, past)
        else:
            error = None if ran.error is None else str(ErrorInfo.of(ran.error))
            ended = (
                self.job.name,
                fence,
                ran.outcome,
                error,
                ran.duration,
                ran.attempts,
                manual,
                past,
            )
        return _new(Ended, ended)

    def _lost_between_attempts(self, lease: Lease) -> None:
        """The lease was lost while no attempt ran (waiting to retry): no run to
        record, and no more retries."""
        lease.told = True
        name = self.job.name
        if self.observers is not None:
            self.observers.lost(name, lease.fence, lease.lost or "")
        self.stats.last_error = lease_lost(lease.lost or "", while_running=False)
        self.logger.error(
            "job %r lost its lease (%s) while waiting to retry: no more retries",
            name,
            lease.lost,
            extra={"job": name},
        )
