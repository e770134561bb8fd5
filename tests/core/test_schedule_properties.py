"""What every schedule promises, for any interval or cron expression, in any zone,
at any instant: properties checked with Hypothesis.

The README's command runs a fixed set of examples (``derandomize``), so a run
cannot flake; ``FASTAPI_JOBS_PROPERTIES=long`` draws many more, at random, to
look for new failures. Each failure found is kept as an ``@example``.
"""

from __future__ import annotations

import functools
import os
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest

from fastapi_jobs import ConfigurationError, Cron, Every, Schedule
from fastapi_jobs._policies import Jittered, jittered
from fastapi_jobs._schedules import MAX_INTERVAL

from ..support.tools import module

module("hypothesis")  # missing, these tests skip here and fail in CI

from hypothesis import HealthCheck, assume, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_US = 1_000_000
ZONES = ["UTC", "Europe/Lisbon", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
# Instants drawn: from the epoch to a year that leaves every schedule's next
# ticks room before year 9999, the last a datetime can show.
FIRST = 0
LAST = int(datetime(9000, 1, 1, tzinfo=UTC).timestamp())
# A float holds every µs up to 2**33 s (2242-03-16); past it, only ticks on
# whole seconds are exact, and any schedule still moves forward.
EXACT_UNTIL = 2.0**33

_LONG = os.environ.get("FASTAPI_JOBS_PROPERTIES") == "long"
PROFILE = settings(
    # The README's command: the same examples on every run, a second or two in all.
    # Looking for new failures: many more, different ones each run.
    derandomize=not _LONG,
    max_examples=5000 if _LONG else 50,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# The long profile takes minutes a test; the README's command, the suite's timeout.
pytestmark = pytest.mark.timeout(3600 if _LONG else 120)


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0, tz: str = "UTC") -> float:
    """The instant of a wall time in ``tz`` (its first pass if it repeats)."""
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(tz)).timestamp()


# -- instants ------------------------------------------------------------------


@functools.cache
def transitions(zone: str) -> tuple[float, ...]:
    """The instants ``zone``'s offset changes, in some decades and the far future."""
    tz = ZoneInfo(zone)
    found: list[float] = []
    week = 7 * 86400
    for year in [*range(1970, 2041), 2100, 2500, 5000, 8999]:
        start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
        for n in range(53):
            lo, hi = start + n * week, start + (n + 1) * week
            if _offset(tz, lo) == _offset(tz, hi):
                continue
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if _offset(tz, mid) == _offset(tz, lo) else (lo, mid)
            found.append(hi)
    return tuple(found)


def _offset(tz: ZoneInfo, at: int) -> timedelta | None:
    return datetime.fromtimestamp(at, tz).utcoffset()


@st.composite
def instants(draw: st.DrawFn, zone: str) -> float:
    """An instant near one of ``zone``'s transitions or anywhere; on a whole
    second more often than not (as ticks are), else on a µs, now and then off it."""
    near = transitions(zone)
    if draw(st.integers(0, 2)) and near:  # two in three: the hours around a change
        second = draw(st.sampled_from(near)) + draw(st.integers(-2 * 3600, 2 * 3600))
    else:
        second = draw(st.integers(FIRST, LAST))
    us = draw(st.sampled_from([0, 0, 0, 1, 500_000, 999_999]) | st.integers(0, _US - 1))
    at = second + us / _US
    if draw(st.integers(0, 9)) == 0:  # a reading between two µs, as time.time() gives
        at += draw(st.sampled_from([-0.3e-6, -1e-9, 1e-9, 0.3e-6]))
    return at


# -- schedules -----------------------------------------------------------------


@st.composite
def everys(draw: st.DrawFn) -> Every:
    """Any interval and offset: some number of a unit a person writes, or any µs."""
    if draw(st.booleans()):
        unit = draw(st.sampled_from([1, 60, 3600, 86400]))
        period_us = draw(st.integers(1, 1000)) * unit * _US // draw(st.sampled_from([1, 7, 1000]))
    else:
        period_us = draw(st.integers(1, int(MAX_INTERVAL * _US)))
    offset_us = draw(st.sampled_from([0, period_us // 2]) | st.integers(0, period_us - 1))
    return Every(seconds=period_us / _US, offset=timedelta(microseconds=offset_us))


def _field(low: int, high: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    """One field of a cron expression: ``*``, or a list of values, ranges and steps."""
    value = st.integers(low, high).map(str)
    if names:
        value |= st.sampled_from(names)
    span = st.tuples(st.integers(low, high), st.integers(low, high)).map(
        lambda pair: f"{min(pair)}-{max(pair)}"
    )
    step = st.integers(1, high - low + 1).map(lambda n: f"/{n}")
    stepped = st.tuples(value | span | st.just("*"), step).map("".join)
    term = value | span | stepped
    return st.just("*") | st.lists(term, min_size=1, max_size=3).map(",".join)


_SECOND = _field(0, 59)
_MINUTE = _field(0, 59)
_HOUR = _field(0, 23) | st.integers(0, 3).map(str)  # the hours zones change in, often
_DAY = _field(1, 31) | st.sampled_from(["L", "LW", "1,L", "15,LW"])
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_MONTH = _field(1, 12, _MONTHS)
_WEEKDAY = (
    _field(0, 7, ["sun", "mon", "tue", "wed", "thu", "fri", "sat"])
    | st.integers(0, 7).map(lambda day: f"{day}L")  # the last of the month
    | st.tuples(st.integers(0, 7), st.integers(1, 5)).map(lambda p: f"{p[0]}#{p[1]}")
)


@st.composite
def crons(draw: st.DrawFn, zone: str) -> Cron:
    """Any expression cronsim reads, of five fields or six (seconds first)."""
    fields = [draw(_MINUTE), draw(_HOUR), draw(_DAY), draw(_MONTH), draw(_WEEKDAY)]
    if draw(st.booleans()):
        fields.insert(0, draw(_SECOND))
    try:
        return Cron(" ".join(fields), tz=zone)
    except ConfigurationError:  # cronsim's checks, or a day no month has
        assume(False)
        raise


@st.composite
def cron_cases(draw: st.DrawFn) -> tuple[Cron, float]:
    zone = draw(st.sampled_from(ZONES))
    return draw(crons(zone)), draw(instants(zone))


@st.composite
def every_cases(draw: st.DrawFn) -> tuple[Every, float]:
    return draw(everys()), draw(instants("UTC"))


@st.composite
def jittered_cases(draw: st.DrawFn) -> tuple[Schedule, Schedule, float]:
    """A schedule, the same with a job's jitter, an instant."""
    zone = draw(st.sampled_from(ZONES))
    if draw(st.booleans()):
        inner: Schedule = draw(everys().filter(lambda every: every.period_us > 1))
        bound = inner.period_us  # type: ignore[attr-defined]
    else:
        inner, bound = draw(crons(zone)), _US  # cron ticks lie a second apart or more
    jitter = timedelta(microseconds=draw(st.integers(1, bound - 1)))
    name = draw(st.text(max_size=8))
    return inner, jittered(name, inner, jitter), draw(instants(zone))


# -- the properties ------------------------------------------------------------


def micro(at: float) -> int:
    """``at`` read to its nearest µs, as a schedule reads an instant (exactly)."""
    return round(Fraction(at) * _US)


def moves_on(schedule: Schedule, at: float) -> list[float]:
    """The next tick is after ``at``, and the ticks after it increase; them."""
    found = [schedule.next_after(at)]
    for _ in range(4):
        found.append(schedule.next_after(found[-1]))
    assert at < found[0] < found[1] < found[2] < found[3] < found[4]
    return found


def just_before(tick: float) -> float:
    """An instant before ``tick`` and after the tick before it: a µs, or a second
    where a float no longer holds µs (there, ticks lie on whole seconds)."""
    return (micro(tick) - 1) / _US if tick < EXACT_UNTIL else tick - 1


def keeps_the_grid(schedule: Schedule, at: float) -> None:
    """Stepping forward, looking back and counting find the same ticks at ``at``."""
    ahead = moves_on(schedule, at)
    nxt = ahead[0]
    assert all(schedule.last_at_or_before(tick) == tick for tick in ahead)
    last = schedule.last_at_or_before(at)
    assert micro(last) <= micro(at)
    assert schedule.next_after(last) == nxt  # no tick between the last and at
    assert schedule.last_at_or_before(just_before(nxt)) == last  # nor between at and the next
    assert schedule.ticks_between(at, at) == (0, at)
    for count, (before, tick) in enumerate(zip([at, *ahead], ahead, strict=False), 1):
        assert schedule.ticks_between(at, tick) == (count, tick)
        assert schedule.ticks_between(at, just_before(tick)) == (count - 1, before)


def on_whole_seconds(schedule: Every) -> bool:
    """Whether ``schedule``'s ticks lie on whole seconds, which floats hold to year 9999."""
    return schedule.period_us % _US == 0 and schedule.offset.microseconds == 0


# What Hypothesis found, each kept as an example. An interval of a few µs past
# 2**32 s (2106): a tick was read back as the µs beside it, and stepping stopped.
@example(case=(Every(seconds=2e-6, offset=1e-6), 4294967296.0))
@example(case=(Every(seconds=1e-6), 8589934592.0))
# Past 2**33 s a float holds no single µs: the next tick was the instant itself.
@example(case=(Every(seconds=1e-6), 17179869184.0))
@PROFILE
@given(case=every_cases())
def test_every_keeps_its_grid(case: tuple[Every, float]) -> None:
    """An interval's next tick is after t; stepping, looking back and counting
    agree at any instant (where a float holds its µs: it still moves on past)."""
    schedule, at = case
    ahead = moves_on(schedule, at)
    if ahead[-1] < EXACT_UNTIL or on_whole_seconds(schedule):
        keeps_the_grid(schedule, at)


# The issue's own: an hourly cron, one hour past Lisbon's fall-back (its fold).
@example(case=(Cron("0 * * * *", tz="Europe/Lisbon"), ts(2026, 10, 25, 1)))
# A fixed time of day in a repeated hour's second pass: the next tick was its
# first pass's, before t.
@example(case=(Cron("30 1 * * *", tz="Europe/Lisbon"), ts(2026, 10, 25, 1, 15)))
# Lord Howe's half-hour shifts: stepping an hour at a time in UTC landed on :30
# and skipped half an hour of ticks, looking back and forward.
@example(case=(Cron("* 0 * * *", tz="Australia/Lord_Howe"), 499188600.0))
@example(case=(Cron("* 1 * * *", tz="Australia/Lord_Howe"), 352216800.0))
# An instant a part of a µs before a tick (or a change of offset): looking back
# read it to the whole second below, stepping forward to the nearest µs.
@example(case=(Cron("* * * * *"), -3e-07))
@example(case=(Cron("* * * L * *", tz="Australia/Lord_Howe"), 352216799.9999997))
@example(case=(Cron("* * * * * 6L", tz="Europe/Lisbon"), 212543999.9999997))
@PROFILE
@given(case=cron_cases())
def test_cron_keeps_its_ticks(case: tuple[Cron, float]) -> None:
    """A cron's next tick is after t; stepping, looking back and counting agree,
    in zones with DST and half-hour shifts, at any instant."""
    keeps_the_grid(*case)


# Past 2242, where a float is coarser than a µs, the jittered tick was the instant:
# as the interval's own did, and moved by the jitter's offset (a random search's).
@example(
    case=(
        Every(seconds=1, offset=0.000187),
        Jittered(Every(seconds=1, offset=0.000187), 0, 1),
        16732659600.0,
    )
)
@example(
    case=(
        Every(seconds=0.001, offset=0.000391),
        Jittered(Every(seconds=0.001, offset=0.000391), 142, 209),
        9525557413.720531,
    )
)
# Lord Howe's half-hour shift, under a jitter.
@example(
    case=(
        Cron("* 1 * * *", tz="Australia/Lord_Howe"),
        Jittered(Cron("* 1 * * *", tz="Australia/Lord_Howe"), 0, 1),
        352216800.0,
    )
)
@PROFILE
@given(case=jittered_cases())
def test_jitter_stays_inside_the_interval(case: tuple[Schedule, Schedule, float]) -> None:
    """A jittered schedule keeps the properties; each of its ticks lies in
    ``[tick, tick + jitter)`` of the schedule's own, before the next one."""
    inner, schedule, at = case
    ahead = moves_on(schedule, at)
    if ahead[-1] >= EXACT_UNTIL:
        return  # µs apart from whole seconds: it moves on, no more
    keeps_the_grid(schedule, at)
    for tick in ahead:
        base = inner.last_at_or_before(tick)
        assert 0 <= micro(tick) - micro(base) < schedule.jitter_us  # type: ignore[attr-defined]
        assert inner.next_after(base) > tick
