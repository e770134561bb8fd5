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
import math
from collections.abc import Awaitable, Callable, Mapping

import anyio

from .._clock import OffsetClock
from .._store import FUTURE_MARGIN, Store
from .health import StoreHealth

__all__ = ["Heartbeat", "OffsetEstimate"]

# A change of the offset larger than this is a clock that jumped (NTP step,
# a VM resumed), worth a warning; smaller ones are network jitter.
_JUMP = 1.0
# Two clocks drift apart by at most this (500 ppm: NTP's bound for a sane clock).
_DRIFT = 500e-6
# Databases read their clocks to the millisecond at worst (SQLite's 'now').
_RESOLUTION = 0.001
# Bounds on the offset narrower than this need no second beat at start.
_PRECISE = 0.005
# The run history is pruned when an instance starts and then this often
# (seconds), by every instance: pruning is idempotent, and cheap when there is
# nothing to prune.
PRUNE_EVERY = 600.0


class OffsetEstimate:
    """The database clock's offset to the local one, from the beats' round trips.

    The database reads its clock somewhere between a beat's sending and its
    answer, so each beat bounds the offset to ``[db - received, db - sent]``: as
    wide as the round trip, which a loaded host or a lock wait makes long, and
    lopsided (the time is read after the wait). Taking its middle put a
    process's ticks up to 60 ms early under load, on SQLite, where the true
    offset is 0. Instead the bounds of successive beats are intersected (the
    older ones widened by the drift since), so the estimate is as tight as the
    quickest recent beat; bounds that do not meet mean a clock was stepped, and
    the estimate starts over from the new beat.
    """

    def __init__(self) -> None:
        self.low, self.high = -math.inf, math.inf
        self._at: float | None = None  # when the last beat was sent

    def add(self, sent: float, db_time: float, received: float) -> float:
        """Take one beat's reading (local times around the database's); the
        offset now estimated (database minus local)."""
        low, high = db_time - received - _RESOLUTION, db_time - sent + _RESOLUTION
        if self._at is not None:
            widen = max(0.0, sent - self._at) * _DRIFT
            old_low, old_high = self.low - widen, self.high + widen
            if low <= old_high and old_low <= high:
                low, high = max(low, old_low), min(high, old_high)
        self.low, self.high, self._at = low, high, sent
        return (low + high) / 2


class Heartbeat:
    """Beats every ``store.heartbeat`` seconds; keeps ``clock.offset`` current."""

    def __init__(
        self,
        store: Store,
        clock: OffsetClock,
        logger: logging.Logger,
        on_pauses: Callable[[Mapping[str, tuple[float, int]]], None],
    ) -> None:
        self.store = store
        self.clock = clock
        self.logger = logger
        self.on_pauses = on_pauses
        """Given the store's pauses at each beat (what `Store.pauses` returns)."""
        self.on_step: Callable[[], None] | None = None
        """Called when the offset moved by a step (see `beat`)."""
        self.health: StoreHealth | None = None
        """Told whether each beat went through (set while the scheduler runs)."""
        self.also: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        """Reads made at each beat, after it (the stored schedules' changes), by
        name: each under the store's timeout, a failure logged."""
        self._measured = False
        self._estimate = OffsetEstimate()
        self._soon: anyio.Event | None = None  # set to beat before the interval ends

    async def run(self) -> None:
        """The heartbeat's task: beats until cancelled, and prunes the run history."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._prune_now_and_then)
            soon = self._soon = anyio.Event()
            while True:
                with anyio.move_on_after(self.store.heartbeat):
                    await soon.wait()
                soon = self._soon = anyio.Event()  # before the beat: asked during it, again
                await self.beat()

    def soon(self) -> None:
        """Beat now (and read what each beat reads), not at the end of the
        interval: a claim found a stored schedule changed. Asked again while a
        beat goes, it beats once more right after."""
        if self._soon is not None:
            self._soon.set()

    async def _prune_now_and_then(self) -> None:
        """Prunes at once, then every PRUNE_EVERY, beside the beats (a slow prune
        delays no beat and no tick). At once, because instances may live far less
        than PRUNE_EVERY (restarted by deploys, or `fastapi-jobs run`): pruned
        only by an instance that lived that long, the history grew past its
        bound."""
        while True:
            await self.prune()
            await anyio.sleep(PRUNE_EVERY)

    async def start(self) -> None:
        """The beats before the first tick. The first beat opens a connection
        (and prepares statements) before the database reads its clock, so it
        bounds the offset loosely and off-centre; a second beat, if the first
        was slow, keeps the first ticks from firing early by half that time."""
        await self.beat()
        if self._measured and self._estimate.high - self._estimate.low > _PRECISE:
            await self.beat()

    async def prune(self) -> None:
        try:
            with anyio.fail_after(max(self.store.timeout, 30.0)):
                await self.store.prune()
        except Exception as exc:  # noqa: BLE001 - the next prune tries again
            self.logger.warning("pruning the run history failed: %r", exc)

    @property
    def uncertainty(self) -> float:
        """How far `clock` may read off the database's clock: half the width of
        the offset's bounds (FUTURE_MARGIN before they are measured)."""
        width = self._estimate.high - self._estimate.low
        return width / 2 if math.isfinite(width) else FUTURE_MARGIN

    def heard(self, sent: float, db_time: float, received: float) -> None:
        """A reading of the database's clock (``db_time``) by a call sent and
        answered at these `local` times: a beat's, or a claim's that the store
        refused as ahead of the database's clock (a step learned at once, not
        at the next beat). Moves the offset."""
        offset = self._estimate.add(sent, db_time, received)
        moved = offset - self.clock.offset
        self.clock.offset = offset
        if self._measured and abs(moved) > _JUMP:
            # One of the clocks was stepped: the database's (an operator, NTP on
            # its host), or the local one stood still while the database's went
            # on (a VM or a laptop suspended: the monotonic clock stops with it),
            # or a custom clock jumped. The timer sleeps on the old offset: wake
            # it, so that the ticks due since run now (the latest one, as after
            # any late wake), not after the step's size.
            self.logger.warning(
                "this host's clock moved %+.1fs against the database's; ticking on "
                "the database's time (the store refuses claims of future ticks)",
                -moved,
            )
            if self.on_step is not None:
                self.on_step()
        self._measured = True

    async def beat(self) -> None:
        """One beat; a failure is logged, and the next beat tries again."""
        local = self.clock.local
        try:
            with anyio.fail_after(self.store.timeout):
                sent = local()
                db_time = await self.store.beat()
                received = local()
                # Pauses taken on other instances: the claims enforce them at
                # once; this tells the status and spares the claims of paused
                # jobs, and lifts a resume made elsewhere.
                pauses = await self.store.pauses()
        except Exception as exc:  # noqa: BLE001 - the next beat retries
            self.logger.warning("instance heartbeat failed: %r", exc)
            if self.health is not None:
                self.health.failed("heartbeats", exc)
            return
        if self.health is not None:
            self.health.ok("heartbeats")
        self.on_pauses(pauses)
        self.heard(sent, db_time, received)
        for name, read in self.also:
            try:
                with anyio.fail_after(self.store.timeout):
                    await read()
            except Exception as exc:  # noqa: BLE001 - the next beat reads again
                self.logger.warning("reading %s failed: %r", name, exc)
