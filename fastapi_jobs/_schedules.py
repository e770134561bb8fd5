"""Schedules: pure functions from an instant to the next tick.

Instants are POSIX timestamps (float seconds since the Unix epoch, UTC). A
schedule never reads a clock, so every process and every restart that asks
the same question gets the same answer, and tests need no clock at all.
"""

from __future__ import annotations

import abc
import math
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from . import _checks
from ._clock import as_datetime
from ._errors import ConfigurationError, short

__all__ = ["Cron", "Every", "Schedule", "as_us"]

_US = 1_000_000
# Catch-up counting for cron walks tick by tick; past this many ticks the
# count is reported as this number (the latest tick is still exact).
_MAX_COUNTED = 100_000
_EPOCH_2000 = datetime(2000, 1, 1, tzinfo=UTC)
MAX_INTERVAL = 100 * 365.25 * 86400
"""The longest interval: ticks past year 9999 cannot be shown as a datetime."""


def as_us(ts: float) -> int:
    """The instant ``ts`` in whole µs: the nearest, exact up to 2**33 s (2242)."""
    # Ticks round-trip through float; rounding (not flooring) recovers the
    # exact microsecond a tick was computed from. The whole seconds apart: the
    # product of an instant by a million is itself rounded past 2**32 s (2106),
    # which read a tick of a few-µs interval as the µs beside it.
    whole = math.floor(ts)
    return whole * _US + round((ts - whole) * _US)


class Schedule(abc.ABC):
    """When a job runs. Subclass it for a schedule of your own.

    A subclass implements `next_after` and `describe`; `last_at_or_before` too
    for `run_on_startup` with a store and for `fastapi-jobs run`.
    `ticks_between` has a generic implementation that subclasses may speed up.
    """

    # Empty, so that the built-in schedules' own __slots__ take effect (a
    # subclass of yours without __slots__ simply gets a __dict__).
    __slots__ = ()

    @abc.abstractmethod
    def next_after(self, ts: float) -> float:
        """The first tick strictly after POSIX time ``ts``."""

    @abc.abstractmethod
    def describe(self) -> str:
        """A short human-readable description, shown on the status page."""

    def last_at_or_before(self, ts: float) -> float:
        """The latest tick at or before ``ts``."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot look backwards: implement last_at_or_before()"
        )

    def ticks_between(self, after: float, until: float) -> tuple[int, float]:
        """Count the ticks ``t`` with ``after < t <= until``; return it and the last.

        When there is none the count is 0 and the "last" is ``after``.
        """
        count, last = 0, after
        nxt = self.next_after(after)
        while nxt <= until:
            count, last = count + 1, nxt
            if count >= _MAX_COUNTED:
                # Find the true latest tick without counting the rest.
                return count, self._latest_at_or_before(until, nxt)
            nxt = self.next_after(nxt)
        return count, last

    def _latest_at_or_before(self, until: float, known: float) -> float:
        # Generic and slow; schedules that can look backwards override it.
        nxt = self.next_after(known)
        while nxt <= until:
            known, nxt = nxt, self.next_after(nxt)
        return known

    def next_datetime(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (an aware datetime), in UTC."""
        if after.tzinfo is None:
            raise ValueError("pass an aware datetime (with tzinfo), not a naive one")
        return as_datetime(self.next_after(after.timestamp()))

    def __str__(self) -> str:
        return self.describe()


class Every(Schedule):
    """A fixed interval on a grid anchored at the Unix epoch, plus ``offset``.

    ``Every(hours=1)`` ticks at every full UTC hour; ``Every(days=1,
    offset=timedelta(hours=7))`` at 07:00 UTC each day. Every process and
    every restart computes the same ticks, so a deploy never resets the clock
    of a daily job, and the next tick never depends on when a run ended.
    """

    __slots__ = ("_offset_us", "_period_us", "interval", "offset")

    def __init__(
        self,
        *,
        days: float = 0,
        hours: float = 0,
        minutes: float = 0,
        seconds: float = 0,
        offset: float | timedelta = 0,
    ) -> None:
        total = 0.0
        for key, value, unit in (
            ("days", days, 86400),
            ("hours", hours, 3600),
            ("minutes", minutes, 60),
            ("seconds", seconds, 1),
        ):
            total += unit * _checks.seconds(
                key,
                value,
                context="every(): ",
                allow_zero=True,
                maximum=MAX_INTERVAL / unit,
                unit=key,
            )
        if total > MAX_INTERVAL:
            raise ConfigurationError(
                f"an interval of {total:g}s is too long: the most is {MAX_INTERVAL:g}s "
                "(100 years), so that every tick is a date Python can show"
            )
        period_us = round(total * _US)
        if period_us <= 0:
            raise ConfigurationError(
                "an interval must be longer than zero: pass days=, hours=, minutes= "
                "or seconds=, for example every(minutes=5)"
            )
        offset_us = round(
            _checks.seconds("offset", offset, context="every(): ", allow_zero=True) * _US
        )
        if offset_us >= period_us:
            raise ConfigurationError(
                f"offset={offset!r} must be >= 0 and shorter than the interval "
                f"({timedelta(microseconds=period_us)})"
            )
        self._period_us = period_us
        self._offset_us = offset_us
        self.interval = timedelta(microseconds=period_us)
        self.offset = timedelta(microseconds=offset_us)

    @property
    def period_us(self) -> int:
        """The interval in whole microseconds: ticks lie this far apart exactly."""
        return self._period_us

    def next_after(self, ts: float) -> float:
        off, period = self._offset_us, self._period_us
        k = (as_us(ts) - off) // period + 1
        tick = (off + k * period) / _US
        # Past 2**33 s (year 2242) a float no longer holds every µs: a tick less
        # than a float's step after ts reads as ts itself. The next one that a
        # float tells apart is the next tick, so that a schedule always moves on.
        while tick <= ts:
            k += 1
            tick = (off + k * period) / _US
        return tick

    def last_at_or_before(self, ts: float) -> float:
        off, period = self._offset_us, self._period_us
        return (off + (as_us(ts) - off) // period * period) / _US

    def ticks_between(self, after: float, until: float) -> tuple[int, float]:
        off, period = self._offset_us, self._period_us
        ka = (as_us(after) - off) // period
        kb = (as_us(until) - off) // period
        if kb <= ka:
            return 0, after
        return kb - ka, (off + kb * period) / _US

    def describe(self) -> str:
        text = f"every {_human(self.interval)}"
        if self.offset:
            text += f" (+{_human(self.offset)})"
        return text

    def __repr__(self) -> str:
        return f"Every(seconds={self._period_us / _US!r}, offset={self._offset_us / _US!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Every):
            return NotImplemented
        return (self._period_us, self._offset_us) == (other._period_us, other._offset_us)

    def __hash__(self) -> int:
        return hash((Every, self._period_us, self._offset_us))


class Cron(Schedule):
    """A cron expression in a timezone, parsed by `cronsim`.

    Five fields (minute hour day month weekday) or six (seconds first); names
    such as ``mon-fri`` and ``jan``. Wall-clock by nature: ``Cron("0 7 * * *",
    tz="Europe/Lisbon")`` runs at 07:00 Lisbon time in winter and summer, and
    DST transitions behave as in Debian cron: a fixed time of day (five fields,
    no ``*`` in the minute and the hour) skipped in spring runs at the first
    minute after it (01:30 at 02:00), and one repeated in autumn runs once; any
    other expression runs at each local time it matches (``0 * * * *`` at both
    01:00 of a repeated hour, at none of a skipped one).
    """

    __slots__ = ("_explained", "_wall", "expr", "tz")

    def __init__(self, expr: str, tz: str | tzinfo = "UTC") -> None:
        if not isinstance(expr, str):
            raise ConfigurationError(f"a cron expression is a string, got {expr!r}")
        self.tz = _zone(tz)
        self.expr = " ".join(expr.split())
        if self.expr.startswith("@"):
            alias = _ALIASES.get(self.expr.lower())
            if alias is None:
                raise ConfigurationError(
                    f"cron {short(expr)}: the @ names are {', '.join(_ALIASES)}"
                    + (
                        " (for @reboot, use run_on_startup=True)"
                        if self.expr.lower() == "@reboot"
                        else ""
                    )
                )
            self.expr = alias
        try:
            self._explained = CronSim(self.expr, datetime.now(self.tz)).explain()
        except CronSimError as exc:
            raise ConfigurationError(
                f"invalid cron expression {short(expr)} ({exc}): use 5 fields "
                "'minute hour day month weekday' or 6 with seconds first, "
                "for example '0 7 * * mon-fri'"
            ) from None
        minute, hour = self.expr.split()[:2]
        # As in Debian cron, a fixed time of day (five fields, the minute's and
        # the hour's not starting with '*') is a wall time: cronsim walks wall
        # time, runs a skipped time when the clock jumps past it and a repeated
        # one once. Any other expression ticks at each instant whose wall time
        # matches.
        self._wall = len(self.expr.split()) == 5 and "*" not in (minute[0], hour[0])
        try:
            # cronsim looks 50 years ahead; a cron that ticks at all ticks at
            # least every 40 (a 29 February on a given weekday).
            next(CronSim(self.expr, _EPOCH_2000))
        except StopIteration:
            raise ConfigurationError(
                f"cron {short(expr)} never ticks: no date has both its day of month "
                "and its weekday (when one of the two starts with '*', a date must "
                "match both); change one of them"
            ) from None

    def next_after(self, ts: float) -> float:
        start = datetime.fromtimestamp(ts, self.tz)
        if not self._wall:
            return self._next_by_offsets(start)
        ticks = CronSim(self.expr, start)
        tick = next(ticks).timestamp()
        if start.fold:
            # ts is in a repeated hour's second pass, which Debian cron's walk of
            # wall time reads as the first: its ticks there ran in the first
            # pass (a repeated hour runs once), before ts.
            while tick <= ts:
                tick = next(ticks).timestamp()
        return tick

    def last_at_or_before(self, ts: float) -> float:
        # Cron ticks are whole seconds; a start with microseconds makes cronsim's
        # reverse iteration consider the whole second itself first.
        start = datetime.fromtimestamp(math.floor(ts), self.tz).replace(microsecond=1)
        last = next(CronSim(self.expr, start, reverse=True)).timestamp()
        # Walking back, cronsim stops short of ticks next to a change of offset
        # (half an hour of them, after Lord Howe's half-hour shift), and of the
        # second that ts, read to the µs, rounds up to: the ticks ahead of its
        # answer, found by next_after(), tell.
        nxt = self.next_after(last)
        while as_us(nxt) <= as_us(ts):
            last, nxt = nxt, self.next_after(nxt)
        return last

    def _next_by_offsets(self, start: datetime) -> float:
        """The next tick of an expression that ticks at each instant whose wall
        time matches: twice in a repeated hour, never in a skipped one."""
        # cronsim steps through a zone an hour at a time in UTC, which after a
        # half-hour shift (Lord Howe) lands on :30 and skips half an hour of
        # ticks. At a fixed offset it is exact: walk each stretch of one offset.
        at, offset = start.timestamp(), start.utcoffset()  # read to the µs
        while True:
            start = datetime.fromtimestamp(at, timezone(offset or _NO_OFFSET))
            tick = next(CronSim(self.expr, start)).timestamp()
            change = _change(self.tz, at, tick, offset)
            if change is None:
                return tick
            at, offset = change - 1, _offset(self.tz, change)

    def _latest_at_or_before(self, until: float, known: float) -> float:
        return max(known, self.last_at_or_before(until))

    def describe(self) -> str:
        return f"cron '{self.expr}' {self.tz} ({self._explained})"

    def __repr__(self) -> str:
        return f"Cron({self.expr!r}, tz={str(self.tz)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cron):
            return NotImplemented
        return (self.expr, str(self.tz)) == (other.expr, str(other.tz))

    def __hash__(self) -> int:
        return hash((Cron, self.expr, str(self.tz)))


# The names Vixie cron takes for common expressions (cronsim takes none).
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def _zone(tz: str | tzinfo) -> tzinfo:
    if isinstance(tz, tzinfo):
        return tz
    if not isinstance(tz, str):
        raise ConfigurationError(f"tz= takes an IANA name or a tzinfo, got {short(tz)}")
    if tz.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name past a file's
        raise ConfigurationError(
            f"unknown timezone {short(tz)}: use an IANA name such as 'Europe/Lisbon' "
            "or 'UTC' (on a system without tz data, install the tzdata package)"
        ) from None


_NO_OFFSET = timedelta(0)
_DAY = 86400


def _offset(tz: tzinfo, ts: float) -> timedelta | None:
    return datetime.fromtimestamp(ts, tz).utcoffset()


def _change(tz: tzinfo, since: float, until: float, offset: timedelta | None) -> int | None:
    """The first whole second after ``since``, up to ``until``, at which ``tz`` is
    no longer at ``offset`` (its offset just after ``since``); None if it stays.
    A zone's offset changes on a whole second, and never twice in a day."""
    if isinstance(tz, timezone):
        return None
    near = math.floor(since)  # never read: the offset holds after it
    while near < until:
        far = min(near + _DAY, math.ceil(until))
        if _offset(tz, far) != offset:
            while far - near > 1:
                mid = (near + far) // 2
                near, far = (mid, far) if _offset(tz, mid) == offset else (near, mid)
            return far
        near = far
    return None


def _human(delta: timedelta) -> str:
    total = delta.total_seconds()
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if total >= size:
            count, total = divmod(total, size)
            parts.append(f"{int(count)}{unit}")
    if total or not parts:
        parts.append(f"{total:g}s")
    return "".join(parts)
