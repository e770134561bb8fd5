"""A job's policies: what a tick that comes during a run does (``overlap``), and
a fixed spread of its ticks (``jitter``).

The overlap policy is carried out by the dispatcher, which meets the busy job,
and the job's task, which runs what was kept (``_core.runner``). Jitter is a
schedule: `Jittered` moves every tick of the one it wraps by the same offset,
derived from the job's name, so every instance and every restart computes the
same ticks and their claims still meet on one tick.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Literal, get_args

from ._checks import seconds
from ._errors import ConfigurationError, short
from ._schedules import Every, Schedule, as_us

__all__ = [
    "OVERLAPS",
    "Jittered",
    "Overlap",
    "check_overlap",
    "jitter_of",
    "jittered",
    "name_offset",
]

Overlap = Literal["skip", "queue_one", "replace"]
"""What a tick that comes while the job runs does: ``skip`` (dropped, counted as
``overlap``), ``queue_one`` (runs once right after the run; more are dropped),
``replace`` (cancels the run, which is recorded as replaced, and runs)."""
OVERLAPS: tuple[str, ...] = get_args(Overlap)

_US = 1_000_000
# Cron's shortest gap is looked for among this many ticks from now: enough for
# any expression a person writes (a yearly leap-day cron still counts 100 years).
_GAPS = 100


def check_overlap(name: str, overlap: object, *, is_async: bool, handoff: bool) -> Overlap:
    """``overlap`` if it is one of `OVERLAPS` and the job can have it."""
    if not isinstance(overlap, str) or overlap not in OVERLAPS:
        raise ConfigurationError(
            f"job {name!r}: overlap={short(overlap)}: pass one of "
            f"{', '.join(repr(o) for o in OVERLAPS)} (default 'skip')"
        )
    if handoff and overlap != "skip":
        raise ConfigurationError(
            f"job {name!r}: overlap={overlap!r} with enqueue=: a hand-off's run is its "
            "enqueue, which takes no time; the queue's worker decides what overlaps"
        )
    if not is_async and overlap == "replace":
        raise ConfigurationError(
            f"job {name!r}: overlap='replace' needs an async job: a sync job runs in a "
            "thread, which cannot be cancelled (use 'queue_one', or make it async def)"
        )
    return overlap  # type: ignore[return-value]


def name_offset(name: str, jitter_us: int) -> int:
    """The offset of ``name``'s ticks, in ``[0, jitter_us)`` µs: the same in every
    process (``hash()`` is salted per process; blake2b is not)."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % jitter_us


def jittered(name: str, schedule: Schedule, jitter: object) -> Schedule:
    """``schedule`` with ``name``'s offset in ``[0, jitter)`` (None: as it is);
    ConfigurationError if ``jitter`` is not shorter than its interval."""
    if jitter is None:
        return schedule
    said = f"job {name!r}: "
    jitter_s = seconds("jitter", jitter, context=said)
    jitter_us = round(jitter_s * _US)
    if jitter_us <= 0:
        raise ConfigurationError(f"{said}jitter={short(jitter)}: must be at least 1 µs")
    gap_us = _shortest_gap_us(schedule)
    if gap_us is not None and jitter_us >= gap_us:
        raise ConfigurationError(
            f"{said}jitter={_shown(jitter_us)} must be shorter than the "
            f"schedule's interval ({_shown(gap_us)}"
            f"{'' if isinstance(schedule, Every) else ', its shortest gap between two ticks'})"
        )
    return Jittered(schedule, name_offset(name, jitter_us), jitter_us)


def jitter_of(schedule: Schedule) -> float | None:
    """The jitter bound of ``schedule``, in seconds (None: not a `Jittered` one)."""
    return schedule.jitter_us / _US if isinstance(schedule, Jittered) else None


def _shown(us: int) -> str:
    try:
        return str(timedelta(microseconds=us))
    except OverflowError:  # past timedelta's 999,999,999 days
        return f"{us / _US:g}s"


def _shortest_gap_us(schedule: Schedule) -> int | None:
    """The interval of an `Every`; the shortest gap among a schedule's next ticks."""
    if isinstance(schedule, Every):
        return schedule.period_us
    try:
        at = schedule.next_after(datetime.now(UTC).timestamp())
        shortest = None
        for _ in range(_GAPS):
            nxt = schedule.next_after(at)
            gap = round((nxt - at) * _US)
            shortest = gap if shortest is None else min(shortest, gap)
            at = nxt
    except Exception:  # noqa: BLE001 - a schedule that fails says so when it ticks
        return None
    return shortest


class Jittered(Schedule):
    """``inner``'s ticks, each ``offset_us`` later (``jitter=``'s schedule)."""

    __slots__ = ("inner", "jitter_us", "offset_us")

    def __init__(self, inner: Schedule, offset_us: int, jitter_us: int) -> None:
        self.inner = inner
        self.offset_us = offset_us
        """This job's offset, in µs."""
        self.jitter_us = jitter_us
        """The bound it was drawn under (``jitter=``), in µs."""

    @property
    def period_us(self) -> int:
        """The interval in µs if ``inner`` is an `Every` (its grid moved), else 0."""
        inner = self.inner
        return inner.period_us if isinstance(inner, Every) else 0

    @property
    def tz(self) -> tzinfo | None:
        """``inner``'s zone, if it has one (a `Cron`)."""
        zone = getattr(self.inner, "tz", None)
        return zone if isinstance(zone, tzinfo) else None

    # In integer µs, so that a tick moved back lands on the inner tick exactly
    # (a float a hair before it would make next_after() return that tick again).
    def _back(self, ts: float) -> float:
        return (as_us(ts) - self.offset_us) / _US

    def _on(self, ts: float) -> float:
        return (as_us(ts) + self.offset_us) / _US

    def next_after(self, ts: float) -> float:
        inner = self.inner.next_after(self._back(ts))
        tick = self._on(inner)
        while tick <= ts:  # past 2242, where a float is coarser than a µs (Every's)
            inner = self.inner.next_after(inner)
            tick = self._on(inner)
        return tick

    def last_at_or_before(self, ts: float) -> float:
        return self._on(self.inner.last_at_or_before(self._back(ts)))

    def ticks_between(self, after: float, until: float) -> tuple[int, float]:
        count, last = self.inner.ticks_between(self._back(after), self._back(until))
        return count, (self._on(last) if count else after)

    def describe(self) -> str:
        offset = timedelta(microseconds=self.offset_us)
        return (
            f"{self.inner.describe()}, jitter {timedelta(microseconds=self.jitter_us)} (+{offset})"
        )

    def __repr__(self) -> str:
        return f"Jittered({self.inner!r}, offset_us={self.offset_us}, jitter_us={self.jitter_us})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Jittered):
            return NotImplemented
        return (self.inner, self.offset_us, self.jitter_us) == (
            other.inner,
            other.offset_us,
            other.jitter_us,
        )

    def __hash__(self) -> int:
        return hash((Jittered, self.inner, self.offset_us, self.jitter_us))
