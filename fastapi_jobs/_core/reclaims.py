"""Hand-off ticks whose claimer may have died: watched, and claimed again.

A claimed tick is never claimed again: an in-process run must not run twice.
A hand-off job's run only enqueues the tick under its key, which the queue
refuses a second time, so a tick claimed and never released (its claimer
SIGKILLed between the claim and the enqueue) may be claimed again once its
lease is over, and enqueued by another instance: once into the queue across a
crash.

An instance whose claim of a hand-off tick came back ``claimed_elsewhere``
watches that job's row: once the lease could have run out (when the claim was
answered, plus the lease, plus a margin) it asks the store to claim the tick
again (``Store.reclaim``). The row still leased (its holder alive, renewing
through a long enqueue): asked again when the lease the store reports ends;
held for another tick: that one is watched instead; released: forgotten. A
watched job's re-claim goes to the store before its next ordinary claim (see
``Dispatcher``), due or not, so that a next tick never overtakes an abandoned one (which
would then be lost for good). A won re-claim runs the job for the old tick
(same key), under a lease and released as any claimed run.

Few rows are watched per process (one per hand-off job at most): a dict and
one timer task, started with the first row watched, not a task per tick.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import anyio

from .._clock import as_datetime
from .._store import Store

if TYPE_CHECKING:
    from .runner import JobRunner

__all__ = ["Reclaims"]


def margin(lease: float) -> float:
    """How long after a lease could have ended a re-claim is asked: the claim's
    answer and the store's reading of the lease are a round trip late."""
    return min(1.0, max(0.05, lease / 10))


class Reclaims:
    """The rows of hand-off jobs this instance watches, by job: ``(tick, at,
    runner)``, the tick the row holds and when (the event loop's clock) to ask
    the store to claim it again."""

    def __init__(self, store: Store, logger: logging.Logger) -> None:
        self.store = store
        self.logger = logger
        self.watched: dict[str, tuple[float, float, JobRunner]] = {}
        self._margin = margin(store.lease)
        self._changed: anyio.Event | None = None
        self._wake_at = math.inf
        self.unanswered: list[JobRunner] = []
        """The runners of the last `reclaim` that the store gave no answer for."""
        self.timer: Callable[[], None] | None = None
        """Starts the timer task (`run`); set by the dispatcher, called once."""

    def saw(self, runner: JobRunner, tick: float, answered_at: float) -> None:
        """``runner``'s claim of ``tick``, answered at ``answered_at``, came back
        claimed elsewhere: watch the job's row (a row already watched stays so:
        the watch follows the row, whatever tick it holds)."""
        name = runner.job.name
        if name not in self.watched:
            self._watch(runner, tick, answered_at + self.store.lease + self._margin)

    def forget(self, job: str) -> None:
        """This instance claimed the job's next tick: the row moved on."""
        self.watched.pop(job, None)

    def among(self, runners: Iterable[JobRunner]) -> list[JobRunner]:
        """Those of ``runners`` whose row is watched. Their re-claim goes before
        their next claim even before it is due: the lease may have begun before
        this instance saw it (a claimer early, or holding for several leases),
        and a re-claim of a row still leased only answers so."""
        watched = self.watched
        return [runner for runner in runners if runner.job.name in watched]

    def _watch(self, runner: JobRunner, tick: float, at: float) -> None:
        self.watched[runner.job.name] = (tick, at, runner)
        if self.timer is not None:
            self.timer()
            self.timer = None
        if at < self._wake_at and self._changed is not None:
            self._changed.set()

    async def run(self, wake: Callable[[list[JobRunner]], Coroutine[Any, Any, None]]) -> None:
        """The timer's task: claims each watched row again when it is due, for
        the runners free to run it (``wake`` wakes the winners), until cancelled."""
        watched = self.watched
        try:
            while True:
                now = anyio.current_time()
                due = [r for tick, at, r in watched.values() if at <= now]
                if due:
                    free = []
                    for runner in due:
                        if runner.stopping:
                            self.forget(runner.job.name)
                        elif runner.busy:
                            # Taken for another tick (its claim on the way): asked again soon.
                            tick, _, _ = watched[runner.job.name]
                            self._watch(runner, tick, now + self._margin)
                        else:
                            runner.take(watched[runner.job.name][0])
                            free.append(runner)
                    if free:
                        await wake(await self.reclaim(free))
                    continue
                self._wake_at = min((at for _, at, _ in watched.values()), default=math.inf)
                self._changed = changed = anyio.Event()
                with anyio.move_on_after(self._wake_at - now):
                    await changed.wait()
        finally:
            self._changed, self._wake_at = None, math.inf

    async def reclaim(self, runners: list[JobRunner]) -> list[JobRunner]:
        """Claim again the watched rows of ``runners`` (each taken for it: in
        flight); the winners, set to run the old tick, are returned to be woken,
        the others settled. What the store said is watched on, or forgotten;
        those it gave no answer for are in `unanswered` until the next call."""
        watched, store = self.watched, self.store
        asked = [(r.job.name, watched[r.job.name][0]) for r in runners]
        sent = anyio.current_time()  # the lease counts from the sending
        won: list[JobRunner] = []
        self.unanswered = []
        try:
            try:
                with anyio.fail_after(store.timeout):
                    answer = await store.reclaim(asked)
            except Exception as exc:  # noqa: BLE001 - asked again a lease later
                self.logger.warning(
                    "store: could not check %d hand-off tick(s) claimed elsewhere, in case "
                    "their claimer died (%r); checked again after a lease",
                    len(asked),
                    exc,
                )
                for runner, (_, tick) in zip(runners, asked, strict=True):
                    self._watch(runner, tick, sent + store.lease)
                self.unanswered = list(runners)
                return won
            now = anyio.current_time()
            for runner, (name, tick) in zip(runners, asked, strict=True):
                if self._answered(runner, tick, answer.get(name), sent, now):
                    won.append(runner)
            return won
        finally:
            for runner in runners:
                if runner not in won:
                    runner.free()

    def _answered(
        self,
        runner: JobRunner,
        tick: float,
        got: int | tuple[float, float] | Exception | None,
        sent: float,
        now: float,
    ) -> bool:
        """What the store answered for ``runner``'s row (see `Store.reclaim`):
        won (set to run the old tick), or watched on, or forgotten."""
        name, lease = runner.job.name, self.store.lease
        if isinstance(got, int):
            self.forget(name)
            runner.take(tick)
            runner.claimed(got, sent)
            self.logger.info(
                "job %r: tick %s was claimed by another instance and never released; "
                "claimed again after its lease",
                name,
                as_datetime(tick).isoformat(),
                extra={"job": name},
            )
            return True
        if isinstance(got, tuple):
            held, left = got
            if left > 0:
                at = now + left + self._margin  # its holder renews: after that lease
            elif held != tick:
                at = now  # another abandoned tick: at once
            else:
                at = now + lease  # over but not taken (paused): a lease later
            self._watch(runner, held, at)
        elif got is None:
            self.forget(name)  # released: ran, or freed
        else:
            runner.logger.warning(
                "job %r: the store refused its claim again: %r; asked again after a lease",
                name,
                got,
                extra={"job": name},
            )
            self._watch(runner, tick, now + lease)
        return False
