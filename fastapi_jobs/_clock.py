"""Clocks: where "now" comes from and how to wait for an instant.

The scheduler reads wall-clock time only through a clock, so that tests can
drive schedules with virtual time (for example with `looptime`), where the
event loop's clock is fast-forwarded but ``time.time()`` is not.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import anyio

# anyio.sleep finds the running library on every call (~1.2 µs, a tenth of a
# tick's whole cost): asyncio's own sleep on asyncio.
from ._core.concurrency import sleep as _sleep

__all__ = ["Clock", "LoopClock", "OffsetClock", "SystemClock", "as_datetime"]


@runtime_checkable
class Clock(Protocol):
    """What the scheduler needs of time. Instants are POSIX timestamps."""

    def now(self) -> float:
        """The current wall-clock time."""
        ...

    def sleep_until(self, ts: float) -> Awaitable[None]:
        """Sleep until about ``ts``. Waking a little early is fine: the
        scheduler reads `now` after waking and sleeps again if needed."""
        ...


class SystemClock:
    """The real clock: ``time.time()``; the default."""

    # The builtin itself, not a method that calls it: read twice per run, a
    # Python frame each was ~2% of a tick.
    now = staticmethod(time.time)

    def sleep_until(self, ts: float) -> Awaitable[None]:
        # The loop sleeps on the monotonic clock and wall time may be stepped
        # or slewed meanwhile (NTP, suspend): the scheduler checks on waking.
        return _sleep(max(0.0, ts - time.time()))


class LoopClock:
    """Wall time that moves with the event loop's own clock.

    ``start`` is the wall time at the moment the clock is first read. With
    `looptime`, which fast-forwards the loop's clock, an hourly job runs 24
    times in a fraction of a real second:

    ```python
    # fragment: in a test under looptime
    clock = LoopClock(datetime(2026, 1, 1, tzinfo=timezone.utc))
    scheduler = Scheduler(clock=clock)
    ```

    It also works on a normal loop, where it runs at real speed.
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("LoopClock(start=...) needs an aware datetime")
        self._start = start.timestamp()
        self._anchor: float | None = None

    def now(self) -> float:
        loop_now = anyio.current_time()
        if self._anchor is None:
            self._anchor = loop_now
        return self._start + (loop_now - self._anchor)

    def sleep_until(self, ts: float) -> Awaitable[None]:
        return _sleep(max(0.0, ts - self.now()))


class OffsetClock:
    """Another clock, shifted by ``offset`` seconds.

    With a store, the scheduler shifts its clock onto the database's: app
    hosts may be seconds apart, and a host that ticks early would claim the
    next tick before the others reach the current one. The offset is measured
    at each instance heartbeat against `local`.

    Over the system clock, `local` is the monotonic clock (anchored once
    to the wall clock): a step of this host's wall clock (NTP, a VM resumed, an
    operator's ``date -s``) then moves nothing, where reading ``time.time()``
    would put every tick off by the step until the next heartbeat, and the
    instants already placed (and the timer's sleep) for good. Other clocks (a
    test's virtual clock, a custom one) are read as they are.
    """

    def __init__(self, inner: Clock, offset: float = 0.0) -> None:
        self.inner = inner
        self.local: Callable[[], float] = inner.now
        """The reading the offset is added to."""
        self._steady = type(inner) is SystemClock
        self._anchor = 0.0
        if self._steady:
            anchor = self._anchor = time.time() - time.monotonic()
            self.local = lambda: time.monotonic() + anchor
        self.offset = offset

    @property
    def offset(self) -> float:
        """Seconds the database's clock is ahead of `local`."""
        return self._offset

    @offset.setter
    def offset(self, offset: float) -> None:
        self._offset = offset
        self._shift = self._anchor + offset  # now(), steady: one C call and an add

    def now(self) -> float:
        # Read twice per run: the monotonic clock directly, not through `local`.
        if self._steady:
            return time.monotonic() + self._shift
        return self.local() + self._offset

    def sleep_until(self, ts: float) -> Awaitable[None]:
        if self._steady:
            return _sleep(max(0.0, ts - self.now()))
        return self.inner.sleep_until(ts - self.offset)


def as_datetime(ts: float) -> datetime:
    """The instant ``ts`` (POSIX seconds) as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, UTC)
