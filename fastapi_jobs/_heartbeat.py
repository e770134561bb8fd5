"""This instance's heartbeat: its row in the store, and its clock's offset to the
database's.

Each beat tells the store that this instance is alive (the status page lists
it) and reads the database's clock. With a store, jobs tick on the database's
time (an ``OffsetClock`` over the local one), so a host whose clock runs ahead
does not claim ticks early; the offset is measured here, once before the first
tick and then at every beat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import anyio

from ._clock import OffsetClock
from ._store import Store

__all__ = ["Heartbeat"]

# A change of the offset larger than this is a clock that jumped (NTP step,
# a VM resumed), worth a warning; smaller ones are network jitter.
_JUMP = 1.0
# The run history is pruned this often (seconds), by every instance: pruning is
# idempotent, and cheap when there is nothing to prune.
PRUNE_EVERY = 600.0


class Heartbeat:
    """Beats every ``store.heartbeat`` seconds; keeps ``clock.offset`` current."""

    def __init__(
        self,
        store: Store,
        clock: OffsetClock,
        logger: logging.Logger,
        on_pauses: Callable[[Mapping[str, float]], None],
    ) -> None:
        self.store = store
        self.clock = clock
        self.logger = logger
        self.on_pauses = on_pauses
        """Given the store's pauses at each beat (what :meth:`Store.pauses` returns)."""
        self._measured = False

    async def run(self) -> None:
        """The heartbeat's task: beats until cancelled; prunes the history now and then."""
        since_prune = 0.0
        while True:
            await anyio.sleep(self.store.heartbeat)
            await self.beat()
            since_prune += self.store.heartbeat
            if since_prune >= PRUNE_EVERY:
                since_prune = 0.0
                await self.prune()

    async def prune(self) -> None:
        try:
            with anyio.fail_after(max(self.store.timeout, 30.0)):
                await self.store.prune()
        except Exception as exc:  # noqa: BLE001 - the next prune tries again
            self.logger.warning("pruning the run history failed: %r", exc)

    async def beat(self) -> None:
        """One beat; a failure is logged, and the next beat tries again."""
        local = self.clock.inner
        try:
            with anyio.fail_after(self.store.timeout):
                sent = local.now()
                db_time = await self.store.beat()
                received = local.now()
                # Pauses taken on other instances: the claims enforce them at
                # once; this tells the status and spares the claims of paused
                # jobs, and lifts a resume made elsewhere.
                pauses = await self.store.pauses()
        except Exception as exc:  # noqa: BLE001 - the next beat retries
            self.logger.warning("instance heartbeat failed: %r", exc)
            return
        self.on_pauses(pauses)
        # The database read its clock about halfway through the round trip.
        offset = db_time - (sent + received) / 2
        moved = offset - self.clock.offset
        if self._measured and abs(moved) > _JUMP:
            self.logger.warning(
                "this host's clock moved %+.1fs against the database's; ticking on "
                "the database's time (the store refuses claims of future ticks)",
                -moved,
            )
        self.clock.offset, self._measured = offset, True
