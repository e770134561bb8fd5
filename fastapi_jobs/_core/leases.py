"""The leases of this instance's claimed runs, renewed from one task.

A claimed run holds a lease in the store. While the run goes, the lease is
renewed every third of its length; once it is lost (another instance holds the
job, or the store cannot be reached before the lease ends) the run is
cancelled. Most runs end long before their first renewal is due, so a run
costs an entry in a heap here, not a task of its own: one keeper task per
scheduler sleeps until the earliest renewal due and sends it. An ended run's
entry is dropped when it comes up, or when ended entries are half the heap
(else jobs at a second leave ten ended leases each in it, a 30 s lease's third);
the keeper sleeps until the earliest entry, ended or not, so that the runs held
after it (nearly all) do not wake it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable

import anyio

from .._store import Store

__all__ = ["Lease", "LeaseKeeper"]

_COMPACT = 64  # ended entries below this are left to come up


class Lease:
    """The lease of one claimed run."""

    __slots__ = ("cancel", "ended", "fence", "job", "logger", "lost", "renewed_at", "told")

    def __init__(
        self,
        job: str,
        fence: int,
        renewed_at: float,
        cancel: Callable[[], object],
        logger: logging.Logger,
    ) -> None:
        self.job = job
        self.fence = fence
        self.renewed_at = renewed_at
        """When the last successful renewal (or the claim) was sent."""
        self.cancel = cancel
        """Cancels the run (its task or its scope): called when the lease is lost."""
        self.logger = logger
        self.lost: str | None = None
        """Why the lease was lost, if it was."""
        self.told = False
        """The loss is recorded, logged and told to the observers (once)."""
        self.ended = False


class LeaseKeeper:
    """Renews the leases of the runs in flight; cancels a run whose lease is lost."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._due: list[tuple[float, int, Lease]] = []  # (renewal due at, order, lease)
        self._order = itertools.count()
        self._changed: anyio.Event | None = None
        self._wake_at = math.inf
        self._ended = 0  # entries of ended leases still in the heap

    def hold(
        self,
        job: str,
        fence: int,
        claimed_at: float,
        cancel: Callable[[], object],
        logger: logging.Logger,
    ) -> Lease:
        """Keep the lease of a claim sent at ``claimed_at`` until `end`;
        ``cancel`` cancels the run if the lease is lost."""
        lease = Lease(job, fence, claimed_at, cancel, logger)
        self._renew_at(lease, claimed_at + self.store.lease / 3)
        return lease

    def end(self, lease: Lease) -> None:
        """The run is over: no more renewals (its entry is dropped lazily)."""
        if lease.ended:
            return
        lease.ended = True
        self._ended += 1
        due = self._due
        if self._ended > _COMPACT and 2 * self._ended > len(due):
            due[:] = [entry for entry in due if not entry[2].ended]  # in place: run() holds it
            heapq.heapify(due)
            self._ended = 0

    async def run(self) -> None:
        """The keeper's task: runs until cancelled, after the last run ended."""
        due = self._due
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    now = anyio.current_time()
                    if due and due[0][0] <= now:
                        lease = heapq.heappop(due)[2]
                        if lease.ended:
                            self._ended -= 1
                        else:
                            tg.start_soon(self._renew, lease)
                        continue
                    self._wake_at = due[0][0] if due else math.inf
                    self._changed = changed = anyio.Event()
                    with anyio.move_on_after(self._wake_at - now):
                        await changed.wait()
        finally:
            # Ready for the next start of the scheduler (on another event loop).
            self._changed, self._wake_at = None, math.inf

    def _renew_at(self, lease: Lease, at: float) -> None:
        heapq.heappush(self._due, (at, next(self._order), lease))
        # The keeper sleeps until the earliest entry, ended or not (popped when
        # it comes up): a lease held after it, as most are, wakes nobody.
        if at < self._wake_at and self._changed is not None:
            self._wake_at = at
            self._changed.set()

    async def _renew(self, lease: Lease) -> None:
        store = self.store
        interval = store.lease / 3
        deadline = lease.renewed_at + store.lease  # from before the last renewal: conservative
        sent = anyio.current_time()
        if sent >= deadline:
            self._lose(lease, "its lease ran out before it could be renewed")
            return
        try:
            with anyio.fail_after(min(store.timeout, deadline - sent)):
                held = await store.renew(lease.job, lease.fence)
        except Exception as exc:  # noqa: BLE001 - retried until the lease runs out
            if not lease.ended:
                lease.logger.warning("job %r: lease renewal failed (%r), retrying", lease.job, exc)
                self._renew_at(lease, min(anyio.current_time() + interval / 4, deadline))
            return
        if lease.ended:
            return
        if not held:
            self._lose(lease, "another instance claimed the job")
            return
        lease.renewed_at = sent
        self._renew_at(lease, sent + interval)

    @staticmethod
    def _lose(lease: Lease, reason: str) -> None:
        if not lease.ended:
            lease.lost = reason
            lease.cancel()
