"""Schedules are pure: tested without any clock."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from fastapi_jobs import ConfigurationError, Cron, Every, Schedule
from fastapi_jobs._schedules import as_us

UTC = UTC
LISBON = ZoneInfo("Europe/Lisbon")


def ts(*args: int, tz: object = UTC) -> float:
    return datetime(*args, tzinfo=tz).timestamp()  # type: ignore[arg-type,misc]


def ticks(schedule: Every | Cron, start: datetime, count: int) -> list[datetime]:
    out, t = [], start
    for _ in range(count):
        t = schedule.next_datetime(t)
        out.append(t)
    return out


def test_every_sums_its_arguments() -> None:
    """every(days=, hours=, minutes=, seconds=) is the sum of its parts."""
    assert Every(days=1, hours=2, minutes=3, seconds=4).interval == timedelta(
        days=1, hours=2, minutes=3, seconds=4
    )
    assert Every(minutes=1.5).interval == timedelta(seconds=90)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"seconds": 0}, {"hours": -1}, {"minutes": 5, "seconds": -1}, {"seconds": float("nan")}],
)
def test_every_rejects_zero_and_negative(kwargs: dict[str, float]) -> None:
    """A zero, negative or non-finite interval fails when declared."""
    with pytest.raises(ConfigurationError, match=r"interval|every"):
        Every(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"hours": 1e6}, "hours=1000000.0: too long; the most it takes is 876600 hours"),
        ({"days": 1e9}, "days=1000000000.0: too long; the most it takes is 36525 days"),
        ({"hours": timedelta(hours=1)}, "a number of hours, not a timedelta"),
        ({"minutes": "5"}, "not a duration; pass a number of minutes"),
        ({"hours": float("nan")}, "must be a finite number of hours"),
    ],
)
def test_every_says_each_part_in_its_own_unit(kwargs: dict[str, object], said: str) -> None:
    """A bad part of an interval is said in the unit it counts; only seconds
    may be a timedelta (hours=timedelta(hours=1) would be 3,600 hours)."""
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        Every(**kwargs)  # type: ignore[arg-type]
    assert Every(seconds=timedelta(minutes=2)).interval == timedelta(minutes=2)  # type: ignore[arg-type]


def test_every_rejects_offset_outside_interval() -> None:
    """The offset must fall inside one interval."""
    with pytest.raises(ConfigurationError, match="offset"):
        Every(hours=1, offset=timedelta(hours=1))
    with pytest.raises(ConfigurationError, match="offset"):
        Every(hours=1, offset=-1)


def test_interval_ticks_lie_on_the_epoch_grid() -> None:
    """An hourly schedule ticks on the full UTC hour, whatever instant it is asked from."""
    every = Every(hours=1)
    assert every.next_after(ts(2026, 3, 2, 10, 17, 23)) == ts(2026, 3, 2, 11)
    assert every.next_after(ts(2026, 3, 2, 10, 59, 59)) == ts(2026, 3, 2, 11)
    # Strictly after: asked at a tick, it gives the following one.
    assert every.next_after(ts(2026, 3, 2, 11)) == ts(2026, 3, 2, 12)


def test_two_processes_and_a_restart_compute_the_same_ticks() -> None:
    """Independent instances asked at different moments agree on every tick."""
    a, b = Every(minutes=7), Every(minutes=7)
    ta = a.next_after(ts(2026, 3, 2, 10, 0, 1))
    assert ta % 420 == 0  # on the grid that starts at the epoch
    for asked in (ta - 419, ta - 200.5, ta - 0.001):
        assert b.next_after(asked) == ta


def test_daily_job_keeps_its_time_across_deploys() -> None:
    """A daily job with an offset runs at the same UTC time whenever the process started."""
    daily = Every(days=1, offset=timedelta(hours=7))
    for started in (ts(2026, 3, 2, 0, 5), ts(2026, 3, 2, 6, 59), ts(2026, 3, 2, 3)):
        assert daily.next_after(started) == ts(2026, 3, 2, 7)
    assert daily.next_after(ts(2026, 3, 2, 7, 0, 1)) == ts(2026, 3, 3, 7)


def test_interval_does_not_drift_over_a_year() -> None:
    """Stepping tick by tick for a year stays on exact grid instants (no float creep)."""
    every = Every(seconds=0.1)
    t = ts(2026, 1, 1)
    for _ in range(100_000):
        t = every.next_after(t)
    assert round(t * 10) == t * 10
    assert t == ts(2026, 1, 1) + 10_000


def test_ticks_between_counts_and_returns_the_latest() -> None:
    """ticks_between counts ticks in (after, until] and gives the latest one."""
    every = Every(hours=1)
    assert every.ticks_between(ts(2026, 3, 2, 1), ts(2026, 3, 2, 5, 30)) == (4, ts(2026, 3, 2, 5))
    assert every.ticks_between(ts(2026, 3, 2, 1), ts(2026, 3, 2, 1, 59)) == (0, ts(2026, 3, 2, 1))
    cron = Cron("0 * * * *")
    assert cron.ticks_between(ts(2026, 3, 2, 1), ts(2026, 3, 2, 5, 30)) == (4, ts(2026, 3, 2, 5))


def test_ticks_between_is_bounded_after_a_very_long_sleep() -> None:
    """After years asleep, a per-second cron finds its latest tick without walking them all."""
    cron = Cron("* * * * * *")
    count, last = cron.ticks_between(ts(2020, 1, 1), ts(2026, 1, 1, 0, 0, 0) + 0.5)
    assert last == ts(2026, 1, 1)
    assert count >= 100_000


def test_cron_five_fields_with_names_in_a_timezone() -> None:
    """'0 7 * * mon-fri' in Lisbon: 07:00 local on weekdays only."""
    cron = Cron("0 7 * * mon-fri", tz="Europe/Lisbon")
    friday_noon = datetime(2026, 3, 6, 12, tzinfo=LISBON)
    got = ticks(cron, friday_noon, 3)
    assert [t.astimezone(LISBON) for t in got] == [
        datetime(2026, 3, 9, 7, tzinfo=LISBON),
        datetime(2026, 3, 10, 7, tzinfo=LISBON),
        datetime(2026, 3, 11, 7, tzinfo=LISBON),
    ]
    assert all(t.tzinfo == UTC for t in got)


def test_cron_six_fields_has_seconds() -> None:
    """A sixth field in front is seconds."""
    cron = Cron("*/15 * * * * *")
    assert cron.next_after(ts(2026, 3, 2, 10, 0, 1)) == ts(2026, 3, 2, 10, 0, 15)


def test_cron_keeps_wall_time_across_dst() -> None:
    """07:00 Lisbon is 07:00 UTC in winter and 06:00 UTC in summer."""
    cron = Cron("0 7 * * *", tz="Europe/Lisbon")
    before, after = ticks(cron, datetime(2026, 3, 28, 8, tzinfo=UTC), 2)
    assert before == datetime(2026, 3, 29, 6, tzinfo=UTC)  # first day of summer time
    assert after == datetime(2026, 3, 30, 6, tzinfo=UTC)
    assert ticks(cron, datetime(2026, 1, 10, 8, tzinfo=UTC), 1) == [
        datetime(2026, 1, 11, 7, tzinfo=UTC)
    ]


def test_cron_spring_forward_runs_a_skipped_time_once_like_debian_cron() -> None:
    """01:30 does not exist on 2026-03-29 in Lisbon: that day it runs at 02:00 local."""
    cron = Cron("30 1 * * *", tz="Europe/Lisbon")
    got = [t.astimezone(LISBON) for t in ticks(cron, datetime(2026, 3, 28, 12, tzinfo=LISBON), 2)]
    assert got == [
        datetime(2026, 3, 29, 2, 0, tzinfo=LISBON),
        datetime(2026, 3, 30, 1, 30, tzinfo=LISBON),
    ]


def test_cron_fall_back_runs_a_repeated_time_once() -> None:
    """01:30 happens twice on 2026-10-25 in Lisbon: it runs once."""
    cron = Cron("30 1 * * *", tz="Europe/Lisbon")
    got = ticks(cron, datetime(2026, 10, 24, 12, tzinfo=UTC), 2)
    assert got[1] - got[0] == timedelta(hours=25)


@pytest.mark.parametrize("expr", ["", "* * *", "61 * * * *", "0 7 * * funday", "0 0 31 2 *"])
def test_cron_rejects_invalid_expressions(expr: str) -> None:
    """An invalid expression fails at declaration and says what a valid one looks like."""
    with pytest.raises(ConfigurationError, match=r"invalid cron expression.*'0 7 \* \* mon-fri'"):
        Cron(expr)


@pytest.mark.parametrize("expr", ["* * */8 * 0#5", "0 0 LW * */7"])
def test_cron_that_never_ticks_is_refused_at_declaration(expr: str) -> None:
    """A day of month and a weekday that no date has both fail at declaration (they
    raised StopIteration at the first tick, a 500 from a schedule made over HTTP)."""
    with pytest.raises(ConfigurationError, match=r"never ticks: no date has both"):
        Cron(expr)
    assert Cron("0 0 * 2 1#5").next_after(ts(2073, 1, 1)) == ts(2112, 2, 29)  # 39 years on


def test_cron_rejects_unknown_timezone() -> None:
    """An unknown timezone fails at declaration with what to use instead."""
    with pytest.raises(ConfigurationError, match=r"unknown timezone 'Mars/Olympus'.*IANA"):
        Cron("0 7 * * *", tz="Mars/Olympus")


def test_describe_is_human_readable() -> None:
    """Status pages show schedules in words."""
    assert Every(hours=1, minutes=30).describe() == "every 1h30m"
    assert Every(days=1, offset=timedelta(hours=7)).describe() == "every 1d (+7h)"
    assert Every(seconds=0.5).describe() == "every 0.5s"
    assert Cron("0 7 * * mon-fri", tz="Europe/Lisbon").describe() == (
        "cron '0 7 * * mon-fri' Europe/Lisbon (At 07:00 on Monday through Friday)"
    )


class TenSeconds(Schedule):
    """A schedule of one's own: every 10 s, with neither of the optional methods."""

    def next_after(self, ts: float) -> float:
        return (math.floor(ts / 10) + 1) * 10.0

    def describe(self) -> str:
        return "every 10 s, my way"


def test_a_schedule_of_ones_own_counts_its_ticks_and_says_what_it_lacks() -> None:
    """The base class counts by stepping; past 100,000 ticks it stops counting
    and still finds the last tick; and it says which method looking backwards
    needs."""
    mine = TenSeconds()
    assert mine.ticks_between(0, 95) == (9, 90.0)
    assert mine.ticks_between(0, 5) == (0, 0)
    assert mine.ticks_between(0, 10 * 100_005) == (100_000, 1_000_050.0)
    with pytest.raises(NotImplementedError) as raised:
        mine.last_at_or_before(100.0)
    assert str(raised.value) == "TenSeconds cannot look backwards: implement last_at_or_before()"


def test_a_naive_datetime_is_refused_with_what_to_pass() -> None:
    with pytest.raises(ValueError, match=r"^pass an aware") as raised:
        Every(hours=1).next_datetime(datetime(2026, 1, 1))
    assert str(raised.value) == "pass an aware datetime (with tzinfo), not a naive one"


def test_a_cron_shows_its_zone_and_equals_one_made_alike() -> None:
    lisbon = Cron("0 9 * * *", tz="Europe/Lisbon")
    assert repr(lisbon) == "Cron('0 9 * * *', tz='Europe/Lisbon')"
    alike = Cron("0 9 * * *", tz=ZoneInfo("Europe/Lisbon"))
    assert lisbon == alike and hash(lisbon) == hash(alike)
    assert lisbon != Cron("0 9 * * *", tz="UTC") and lisbon != Cron(
        "0 10 * * *", tz="Europe/Lisbon"
    )


REFUSALS: dict[str, tuple[Callable[[], object], str]] = {
    "a negative part": (
        lambda: Every(days=-1),
        "every(): days=-1: must be >= 0 days",
    ),
    "no interval": (
        lambda: Every(),
        "an interval must be longer than zero: pass days=, hours=, minutes= or seconds=, "
        "for example every(minutes=5)",
    ),
    "past 100 years": (
        lambda: Every(days=36525, seconds=1),
        "an interval of 3.15576e+09s is too long: the most is 3.15576e+09s (100 years), "
        "so that every tick is a date Python can show",
    ),
    "a negative offset": (
        lambda: Every(minutes=5, offset=-1),
        "every(): offset=-1: must be >= 0 seconds",
    ),
    "an offset not shorter": (
        lambda: Every(minutes=5, offset=300),
        "offset=300 must be >= 0 and shorter than the interval (0:05:00)",
    ),
    "an unknown @ name": (
        lambda: Cron("@often"),
        "cron '@often': the @ names are @yearly, @annually, @monthly, @weekly, @daily, "
        "@midnight, @hourly",
    ),
    "@reboot": (
        lambda: Cron("@Reboot"),
        "cron '@Reboot': the @ names are @yearly, @annually, @monthly, @weekly, @daily, "
        "@midnight, @hourly (for @reboot, use run_on_startup=True)",
    ),
    "a wrong expression": (
        lambda: Cron("x y"),
        "invalid cron expression 'x y' (Wrong number of fields): use 5 fields "
        "'minute hour day month weekday' or 6 with seconds first, for example "
        "'0 7 * * mon-fri'",
    ),
    "one that never ticks": (
        lambda: Cron("* * */8 * 0#5"),
        "cron '* * */8 * 0#5' never ticks: no date has both its day of month and its "
        "weekday (when one of the two starts with '*', a date must match both); "
        "change one of them",
    ),
    "a zone not a name": (
        lambda: Cron("0 7 * * *", tz=5),  # type: ignore[arg-type]
        "tz= takes an IANA name or a tzinfo, got 5",
    ),
    "an unknown zone": (
        lambda: Cron("0 7 * * *", tz="Mars/Olympus"),
        "unknown timezone 'Mars/Olympus': use an IANA name such as 'Europe/Lisbon' or "
        "'UTC' (on a system without tz data, install the tzdata package)",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_each_refusal_says_its_words_whole(case: str) -> None:
    """Each refusal of a schedule, compared whole (a part matched let words
    added around it pass)."""
    make, said = REFUSALS[case]
    with pytest.raises(ConfigurationError) as raised:
        make()
    assert str(raised.value) == said


def test_an_interval_of_exactly_100_years_is_taken() -> None:
    assert Every(days=36525).interval == timedelta(days=36525)


def test_utc_is_a_zone_in_any_case_of_letters() -> None:
    """'utc' is UTC (the tz database has no file of that name)."""
    for name in ("utc", "Utc", "UTC"):
        assert Cron("0 * * * *", tz=name).tz is UTC


def test_a_description_shows_each_unit_and_the_seconds_left() -> None:
    assert Every(minutes=1, seconds=30).describe() == "every 1m30s"
    assert Every(days=1, hours=2, seconds=5).describe() == "every 1d2h5s"
    assert Every(hours=1).describe() == "every 1h"
    assert Every(seconds=0.5).describe() == "every 0.5s"


def test_an_hourly_cron_ticks_at_both_passes_of_a_repeated_hour() -> None:
    """An expression with '*' in its hour is no wall time: it ticks at each
    instant whose wall time matches, so twice in Lisbon's repeated 01:00 (at
    00:00 and 01:00 UTC on 2026-10-25), where a fixed time of day runs once."""
    hourly = Cron("0 * * * *", tz="Europe/Lisbon")
    at = ts(2026, 10, 24, 23, 30)
    ticks = []
    for _ in range(3):
        at = hourly.next_after(at)
        ticks.append(at)
    assert ticks == [ts(2026, 10, 25, 0), ts(2026, 10, 25, 1), ts(2026, 10, 25, 2)]
    once = Cron("0 1 * * *", tz="Europe/Lisbon")
    assert once.next_after(ts(2026, 10, 24, 23, 30)) == ts(2026, 10, 25, 0)
    assert once.next_after(ts(2026, 10, 25, 0)) == ts(2026, 10, 26, 1)


@pytest.mark.parametrize("period_us", [2, 3, 5])
def test_a_few_microsecond_interval_past_2242_gives_the_first_tick_a_float_tells_apart(
    period_us: int,
) -> None:
    """Past 2**33 s a float steps by about 4 µs: of the ticks after ``ts``, the
    first whose float is past it, never a later one."""
    every = Every(seconds=period_us / 1_000_000)
    for step in range(40):
        at = 2**34 + step / 1_000_000
        first = as_us(at) // period_us * period_us  # the tick at or before it, in µs
        candidates = ((first + k * period_us) / 1_000_000 for k in range(1, 20))
        assert every.next_after(at) == next(t for t in candidates if t > at), at


def test_only_a_five_field_fixed_time_is_a_wall_time_across_a_half_hour_shift() -> None:
    """Lord Howe goes from +11 to +10:30 at 15:00 UTC on 2026-04-04, so 01:30 comes
    twice. A time with seconds (six fields) ticks at both; a minute with '*' in
    the hour ticks at each match, the half hour after the shift among them."""
    zone = "Australia/Lord_Howe"
    with_seconds = Cron("0 30 1 * * *", tz=zone)
    assert with_seconds.next_after(ts(2026, 4, 4, 14)) == ts(2026, 4, 4, 14, 30)
    assert with_seconds.next_after(ts(2026, 4, 4, 14, 30)) == ts(2026, 4, 4, 15)
    assert Cron("30 1 * * *", tz=zone).next_after(ts(2026, 4, 4, 14, 30)) == ts(2026, 4, 5, 15)
    assert Cron("30 * * * *", tz=zone).next_after(ts(2026, 4, 4, 14, 30)) == ts(2026, 4, 4, 15)
