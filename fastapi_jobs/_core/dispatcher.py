"""The dispatcher: one timer per instant for every job of a scheduler.

Jobs on one grid come due at the same instants (every job at 1 s ticks at each
whole second), so a tick's cost is paid per instant, not per job: jobs wait in
buckets keyed by their next due instant, a heap holds the distinct instants,
and one task sleeps until the earliest. When it comes, the dispatcher moves
each job of the bucket to its next tick (an integer step on the epoch grid),
counts the ticks of jobs still running as dropped (``overlap``), claims the
ticks of claimed jobs in one call (``_core.claims``) and wakes the jobs that are to
run in slices of ``SLICE``, giving the event loop a turn between slices, so that
a request never waits behind a whole burst of jobs. The claimed jobs due at an
instant on time, ``GROUP_FROM`` or more, are claimed as a set: only the first
instance to claim the instant for that set sends their claims (``_core.claims``'s
`instant`).

Hand-off ticks claimed elsewhere are watched (``_core.reclaims``): a watched job's
re-claim goes to the store just before its ordinary claim, in the same task.

Each job keeps a task of its own between runs (``JobRunner.serve``), parked on
a future that the dispatcher resolves: a run, its exception, its slowness and
its cancel scopes stay the job's own.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Coroutine, Iterator, Mapping
from itertools import islice
from typing import Any

import anyio
import anyio.abc

from .._clock import Clock
from .._errors import TickAheadError
from .claim_answers import apply_answers
from .claims import Claims
from .concurrency import backend
from .reclaims import Reclaims
from .runner import JobRunner

__all__ = ["GROUP_FROM", "SLICE", "WATCH_EVERY", "Dispatcher"]

# Jobs woken between two turns of the event loop. One slice of trivial jobs
# takes ~0.2 ms, so a request waits behind a slice, never behind a burst.
SLICE = 50
# Claimed jobs due at one instant are claimed as a set from this many on: the
# instance that claims the set's instant pays a statement more, every other one
# a claim per job less.
GROUP_FROM = 8
# The timer sleeps on the event loop's (monotonic) clock, and would see a wall
# clock stepped forward meanwhile only when it wakes (after an interval, or a
# day): the clock is watched this often (seconds) instead, so that a job whose
# tick the step passed runs within this. A change of the wall clock against the
# loop's larger than _STEP is a step; NTP's slewing is far smaller.
WATCH_EVERY = 60.0
_STEP = 1.0
# Timers may fire a hair before the wall clock reaches the instant (the loop
# sleeps on the monotonic clock); closer than this counts as on time.
_EARLY = 0.001


class Dispatcher:
    """Wakes the jobs of each instant; claims the claimed ones' ticks first."""

    def __init__(self, clock: Clock, claims: Claims | None) -> None:
        self._clock = clock
        self._claims = claims
        self._buckets: dict[float, list[JobRunner]] = {}
        self._instants: list[float] = []  # a heap of the buckets' keys
        self._target = math.inf  # the instant the timer sleeps for
        self._sleep: anyio.CancelScope | None = None
        self._timer = anyio.CancelScope()  # the timer loop's, cancelled by stop()
        self._tg: anyio.abc.TaskGroup | None = None
        self.reclaims = None if claims is None else Reclaims(claims.store, claims.logger)
        """The hand-off rows watched for an abandoned tick (with a store)."""
        self._reclaiming = anyio.CancelScope()  # the re-claims' timer's, cancelled by stop()
        self.ended = anyio.Event()
        """Set when the timer and every claim of the dispatcher have ended."""

    def add(self, runner: JobRunner, tick: float) -> None:
        """Run ``runner`` at ``tick`` (and from there on its schedule)."""
        runner.place(tick)
        bucket = self._buckets.get(tick)
        if bucket is None:
            self._buckets[tick] = [runner]
            heapq.heappush(self._instants, tick)
            if tick < self._target and self._sleep is not None:
                self._sleep.cancel()  # the timer sleeps for a later instant
        else:
            bucket.append(runner)
        runner.stats.next_run_at = tick

    async def run(self) -> None:
        """The timer's task: dispatches each instant as it comes until `stop`,
        then waits for the claims in flight (their winners run). Sets
        `ended` when it returns, however it does."""
        clock, instants, buckets = self._clock, self._instants, self._buckets
        checkpoint = backend().checkpoint  # a turn of the loop: asyncio.sleep(0) on asyncio
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                watching = anyio.CancelScope()
                tg.start_soon(self._watch_the_clock, watching)
                if self.reclaims is not None:

                    def start_reclaims() -> None:
                        tg.start_soon(self._reclaim_timer, checkpoint)

                    self.reclaims.timer = start_reclaims
                with self._timer:
                    while True:
                        target = self._target = instants[0] if instants else math.inf
                        if clock.now() < target - _EARLY:
                            with anyio.CancelScope() as self._sleep:
                                if target == math.inf:
                                    await anyio.sleep_forever()
                                await clock.sleep_until(target)
                            self._sleep = None
                            continue  # woken early (the wall clock was stepped back) or kicked
                        heapq.heappop(instants)
                        await self._dispatch(target, buckets.pop(target), checkpoint)
                watching.cancel()
        finally:
            self._tg, self._sleep, self._target = None, None, math.inf
            if self.reclaims is not None:
                self.reclaims.timer = None
            self.ended.set()

    async def _reclaim_timer(self, checkpoint: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """The re-claims' one task, started with the first row watched."""
        assert self.reclaims is not None

        async def wake(runners: list[JobRunner]) -> None:
            pending = iter(runners)
            try:
                await _wake(pending, checkpoint)
            finally:
                for runner in pending:  # cancelled between two slices
                    runner.free()

        with self._reclaiming:
            await self.reclaims.run(wake)

    async def _watch_the_clock(self, scope: anyio.CancelScope) -> None:
        """Kick the timer when the clock steps against the loop's (see WATCH_EVERY)."""
        clock = self._clock
        with scope:
            seen = clock.now() - anyio.current_time()
            while True:
                await anyio.sleep(WATCH_EVERY)
                wall = clock.now()
                now = wall - anyio.current_time()
                # A step back and one forward between two looks leave the offset
                # where it was, but the timer may have gone back to sleep in
                # between for the step's length: an overdue instant wakes it too.
                if abs(now - seen) > _STEP or wall >= self._target - _EARLY:
                    self.kick()
                seen = now

    def claim_now(self, runner: JobRunner, tick: float) -> None:
        """Claim ``tick`` for ``runner`` now, alone (a tick its predecessor took
        as the job's schedule changed: `JobRunner.handed`), and run it if won.
        The job's own next tick stays where it is."""
        tg = self._tg
        if tg is None:  # stopped meanwhile
            runner.changed_away(tick, "the scheduler is stopping")
            return
        runner.take(tick)
        tg.start_soon(self._claim_then_wake, [runner], backend().checkpoint)

    def kick(self) -> None:
        """The clock's offset changed: sleep again, for the earliest instant as
        the clock now reads it (the instants due meanwhile run at once)."""
        if self._sleep is not None:
            self._sleep.cancel()

    def stop(self) -> None:
        """No more instants. A claim in flight goes on: the ticks it wins are this
        instance's, and run (shutdown waits for them as for any run in flight)."""
        self._timer.cancel()
        self._reclaiming.cancel()

    async def _dispatch(
        self,
        instant: float,
        bucket: list[JobRunner],
        checkpoint: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        # The hot path of the library: one pass per job per tick. Plain
        # attribute reads; no await, scope or allocation per job but the list
        # entries.
        now = self._clock.now()
        buckets, instants = self._buckets, self._instants
        to_wake: list[JobRunner] = []
        to_claim: list[JobRunner] = []
        together: list[str] = []  # the set claimed as one (running here now or not)
        late = False
        last_key, last_bucket = math.nan, bucket
        for runner in bucket:
            if runner.stopping:
                continue  # not placed again: its task is ending
            try:
                nxt = runner.advance(instant)
            except Exception as exc:  # noqa: BLE001 - a schedule of the user's
                runner.schedule_failed(exc)
                continue
            tick = instant
            if nxt <= now:
                # Woke late (blocked loop, machine asleep): only the latest
                # due tick runs; the others are counted as missed.
                late = True
                try:
                    tick, nxt = runner.skip_missed(instant, now)
                except Exception as exc:  # noqa: BLE001 - a schedule of the user's
                    runner.schedule_failed(exc)
                    continue
            if nxt != last_key:
                last_key = nxt
                found = buckets.get(nxt)
                if found is None:
                    found = buckets[nxt] = []
                    heapq.heappush(instants, nxt)
                last_bucket = found
            last_bucket.append(runner)
            stats = runner.stats
            stats.next_run_at = nxt
            if runner.paused_until > tick:
                # A pause taken elsewhere reaches the claim too; an every_instance
                # job whose pause the store has not told yet fails closed.
                runner.skipped("store_unavailable" if runner.pause_unknown else "paused", tick)
                continue
            # runner.busy, with its cheap parts first.
            if runner.in_flight or stats.running or (runner.thread_done and runner.busy):
                # Busy under a claim it holds, a job is in its set: that claim
                # holds the tick for the cluster. Busy otherwise (its claim's
                # answer on its way, a run by hand that claimed nothing), it is
                # out: winning the instant, this instance would claim nothing
                # for it, and its peers, losing it, would skip it. Out of the
                # set, the job's own row decides between them.
                if runner.grouped and runner.holds_claim:
                    together.append(runner.job.name)
                # Dropped, unless the job's overlap policy keeps it for after the run.
                if runner.job.overlap == "skip" or not runner.hold_over(tick):
                    runner.skipped("overlap", tick)
                continue
            if runner.grouped:
                # Paused here, a job is out of the set (above): an instance that
                # has not yet heard of a resume made elsewhere has another set, so
                # the instance that has claims the job by itself.
                together.append(runner.job.name)
            runner.take(tick)
            if runner.leases is None:
                to_wake.append(runner)
            else:
                to_claim.append(runner)
        if to_claim:
            assert self._tg is not None
            # Late, the ticks are not the instant's: each job's own claim decides.
            group = together if len(together) >= GROUP_FROM and not late else None
            self._tg.start_soon(self._claim_then_wake, to_claim, checkpoint, instant, group)
        if to_wake:
            pending = iter(to_wake)
            try:
                await _wake(pending, checkpoint)
            finally:
                for runner in pending:  # cancelled between two slices (the scheduler stops)
                    runner.free()

    async def _claim_then_wake(
        self,
        runners: list[JobRunner],
        checkpoint: Callable[[], Coroutine[Any, Any, None]],
        at: float = math.nan,
        together: list[str] | None = None,
    ) -> None:
        """Claim the ticks of ``runners`` in one call; wake the winners. Those
        due ``at`` that are claimed as a set (``grouped``) go as the set of
        ``together`` (see `_claims.Claims.instant`)."""
        claims = self._claims
        assert claims is not None
        reclaims = self.reclaims
        watching = reclaims is not None and bool(reclaims.watched)
        pending = iter(runners)  # not yet woken nor settled
        try:
            if watching:
                runners = await self._reclaim_first(runners, checkpoint)
                pending = iter(runners)
            instant = None
            if together is not None:
                jobs = [r.job.name for r in runners if r.grouped and r.due == at]
                instant = claims.instant(together, at, jobs)
            claimed_at = anyio.current_time()  # the leases count from the claim's sending
            sent = claims.reading()
            fences = await claims.claim([(r.job.name, r.due) for r in runners], instant=instant)
            ahead: list[JobRunner] = []
            won = apply_answers(pending, fences, claimed_at, reclaims, watching, ahead)
            pending = iter(won)
            if ahead:
                assert not isinstance(fences, Exception)
                self._not_yet(ahead, fences, sent, at)
            await _wake(pending, checkpoint)
        finally:
            # Cancelled (the scheduler stops): the runners not woken are free
            # again, and the claims made for them are released.
            for runner in pending:
                runner.free()

    def _not_yet(
        self,
        runners: list[JobRunner],
        fences: Mapping[str, int | Exception],
        sent: float,
        at: float,
    ) -> None:
        """``runners``' claims were refused: their ticks are still in the future
        on the database's clock (it was stepped back, or this instance's reading
        of it was off). The clock takes the database's reading that came with
        the refusal, and each job is placed again: at the tick refused, if it
        was the instant dispatched (``at``), whose ticks before it this
        instance took already (each claimed here or elsewhere: the ticks the
        database's clock goes over again are all that its step back loses); or,
        if the timer woke late and went over ticks to reach it (this host's
        clock stepped forward), at the first tick after the corrected time and
        after the job's last run here, so none is lost to a wait for the tick
        it jumped to."""
        claims = self._claims
        assert claims is not None
        refused = fences[runners[0].job.name]
        assert isinstance(refused, TickAheadError)
        claims.heard(refused, sent, [runner.job.name for runner in runners])
        now = self._clock.now()
        for runner in runners:
            tick = runner.due
            if tick <= now:
                # Due on the clock corrected, yet refused: the database's
                # reading must be off by more than the claim's margin. Not
                # placed again (the claim would be sent again at once).
                runner.skipped("ahead_of_database", tick)
                continue
            placed = runner.stats.next_run_at
            if placed is None or runner.stopping:
                continue  # its schedule failed, or the job is stopping
            bucket = self._buckets.get(placed)
            if bucket is not None and runner in bucket:
                bucket.remove(runner)
            self.add(runner, tick if tick == at else _first_after(runner, now, tick))

    async def _reclaim_first(
        self, runners: list[JobRunner], checkpoint: Callable[[], Coroutine[Any, Any, None]]
    ) -> list[JobRunner]:
        """Claim again the watched rows of ``runners`` before their next
        tick's claim; wake the winners, which run the old tick (their new one is
        dropped: the old run holds the job). The runners left to claim."""
        reclaims = self.reclaims
        assert reclaims is not None
        due = reclaims.among(runners)
        if not due:
            return runners
        ticks = {runner: runner.due for runner in due}
        for runner in due:
            runner.free()  # the re-claim takes it again: in flight for the old tick
            runner.take(ticks[runner])
        won = await reclaims.reclaim(due)
        for runner in won:
            runner.skipped("overlap", ticks[runner])
        pending = iter(won)
        try:
            await _wake(pending, checkpoint)
        finally:
            for runner in pending:
                runner.free()
        unanswered = reclaims.unanswered
        rest = [r for r in runners if r not in ticks]
        for runner in due:
            if runner in won:
                continue
            if runner in unanswered:
                # Its next tick must not overtake a tick perhaps abandoned: skipped
                # (the store's failure is logged), and the re-claim asked again.
                runner.skipped("store_unavailable", ticks[runner])
                continue
            runner.take(ticks[runner])  # claimed as usual
            rest.append(runner)
        return rest


async def _wake(
    runners: Iterator[JobRunner], checkpoint: Callable[[], Coroutine[Any, Any, None]]
) -> None:
    """Wake ``runners`` in slices, with a turn of the event loop between two. A
    runner is taken from the iterator only as it is woken: cancelled between two
    slices, the iterator holds exactly those not woken."""
    while True:
        woken = 0
        for runner in islice(runners, SLICE):
            runner.wake()
            woken += 1
        if woken < SLICE:
            return
        await checkpoint()


def _first_after(runner: JobRunner, now: float, refused: float) -> float:
    """The tick to place ``runner`` at after ``refused`` was refused as ahead
    of the database's clock, which reads ``now``: the first after ``now`` and
    after the job's last run here (the ticks before it ran already), if it
    comes before ``refused``. A host's clock stepped forward would otherwise
    leave the job waiting for the tick it jumped to."""
    started = runner.stats.last_started_at
    try:
        first = runner.job.schedule.next_after(now if started is None else max(now, started))
    except Exception:  # noqa: BLE001 - a schedule of the user's: it raised for this tick before
        return refused
    return first if now < first < refused else refused
