"""Bad declarations fail at once, with a message that says what to do."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fastapi_jobs import ConfigurationError, Cron, Every, JobContext, Scheduler


async def noop() -> None:
    pass


def test_decorator_returns_the_function_unchanged() -> None:
    """A job stays an ordinary function: tests can call it directly."""
    scheduler = Scheduler()

    async def job(ctx: JobContext) -> None:
        pass

    assert scheduler.every(hours=1)(job) is job
    assert scheduler.jobs["job"].func is job
    assert scheduler.jobs["job"].schedule == Every(hours=1)


def test_no_interval_is_an_error() -> None:
    """every() with nothing is refused, with an example."""
    with pytest.raises(ConfigurationError, match=r"longer than zero.*every\(minutes=5\)"):
        Scheduler().every()


def test_negative_interval_is_an_error() -> None:
    """every(seconds=-5) is refused."""
    with pytest.raises(ConfigurationError, match="seconds=-5"):
        Scheduler().every(seconds=-5)


def test_both_interval_and_cron_is_an_error() -> None:
    """A job gets one schedule: declaring it again with another is refused."""
    scheduler = Scheduler()

    @scheduler.every(hours=1)
    async def both() -> None:
        pass

    with pytest.raises(
        ConfigurationError, match="'both' is declared twice: give one of them name="
    ):
        scheduler.cron("0 * * * *")(both)


def test_schedule_must_be_a_schedule() -> None:
    """add_job takes an Every or a Cron, not a string."""
    with pytest.raises(ConfigurationError, match=r"Every\(...\) or Cron\(...\)"):
        Scheduler().add_job(noop, "0 * * * *")  # type: ignore[arg-type]


def test_invalid_cron_is_an_error() -> None:
    """A bad cron expression fails at the decorator."""
    with pytest.raises(ConfigurationError, match="invalid cron expression '0 25 \\* \\* \\*'"):
        Scheduler().cron("0 25 * * *")


def test_unknown_timezone_is_an_error() -> None:
    """An unknown tz fails at the decorator."""
    with pytest.raises(ConfigurationError, match="unknown timezone 'Europe/Atlantis'"):
        Scheduler().cron("0 7 * * *", tz="Europe/Atlantis")


def test_duplicate_name_is_an_error() -> None:
    """Two jobs named alike: the second one is refused and told to use name=."""
    scheduler = Scheduler()
    scheduler.add_job(noop, Every(hours=1))
    with pytest.raises(
        ConfigurationError, match="'noop' is declared twice: give one of them name="
    ):
        scheduler.add_job(noop, Every(hours=2))
    scheduler.add_job(noop, Every(hours=2), name="noop_2h")
    assert list(scheduler.jobs) == ["noop", "noop_2h"]


def test_not_callable_is_an_error() -> None:
    """Something that is not a function is refused."""
    with pytest.raises(ConfigurationError, match="must be a function"):
        Scheduler().every(hours=1)("not a function")  # type: ignore[type-var]


def test_lambda_needs_a_name() -> None:
    """A lambda has no usable name: the error says to pass name=."""
    with pytest.raises(ConfigurationError, match="give it one with name="):
        Scheduler().add_job(lambda: None, Every(hours=1))
    Scheduler().add_job(lambda: None, Every(hours=1), name="ok")


@pytest.mark.parametrize(
    "bad_name",
    [
        "",
        "  ",
        "a/b",
        " padded",
        "x" * 201,
        "nul\x00",
        "two\nlines",
        "esc\x1b[31m",
        "\ud800",
        "zero\u200bwidth",
        "nb\u00a0sp",
        ".",
        "..",
    ],
)
def test_unusable_names_are_refused(bad_name: str) -> None:
    """Names go into URLs, log lines and a VARCHAR(200) column: what one of them
    cannot carry is refused at declaration, with the rule."""
    with pytest.raises(ConfigurationError, match=r"not usable: .*1 to 200 printable characters"):
        Scheduler().add_job(noop, Every(hours=1), name=bad_name)


def test_a_huge_name_is_not_echoed_whole() -> None:
    """The error about a 60,000-character name shows its start and its length."""
    with pytest.raises(ConfigurationError) as caught:
        Scheduler().add_job(noop, Every(hours=1), name="n" * 60_000)
    assert len(str(caught.value)) < 300 and "60000 characters" in str(caught.value)


@pytest.mark.parametrize(
    "good_name", ["x" * 200, "déjà vu", "billing.digest:eu-1", "名前", "a b", "...", ".x", "?#%"]
)
def test_usable_names_are_accepted(good_name: str) -> None:
    """Any printable name up to 200 characters, spaces and non-ASCII included."""
    Scheduler().add_job(noop, Every(hours=1), name=good_name)


@pytest.mark.parametrize("bad_name", [42, None.__class__, b"bytes"])
def test_a_name_that_is_not_a_string_is_refused(bad_name: object) -> None:
    """name= takes a string."""
    with pytest.raises(ConfigurationError, match="not a string"):
        Scheduler().add_job(noop, Every(hours=1), name=bad_name)  # type: ignore[arg-type]


def test_job_with_two_parameters_is_an_error() -> None:
    """A job takes nothing or one JobContext."""

    async def two(ctx: JobContext, other: int) -> None:
        pass

    with pytest.raises(ConfigurationError, match=r"takes \(ctx, other\).*one"):
        Scheduler().every(hours=1)(two)


def test_job_with_a_parameter_of_another_type_is_an_error() -> None:
    """One parameter annotated as something other than JobContext is refused."""

    async def wrong(db: str) -> None:
        pass

    with pytest.raises(ConfigurationError, match="annotated JobContext"):
        Scheduler().every(hours=1)(wrong)


def test_keyword_only_parameter_is_an_error() -> None:
    """The context is passed positionally; a keyword-only parameter cannot receive it."""

    async def kw(*, ctx: JobContext) -> None:
        pass

    with pytest.raises(ConfigurationError, match="annotated JobContext"):
        Scheduler().every(hours=1)(kw)


def test_accepted_signatures() -> None:
    """No parameters, one JobContext (annotated or not), defaults, partials, sync or async."""
    scheduler = Scheduler()

    def sync_ctx(ctx: JobContext) -> None:
        pass

    async def bare(ctx) -> None:  # type: ignore[no-untyped-def]
        pass

    async def with_default(ctx: JobContext, retries: int = 3) -> None:
        pass

    async def configured(region: str, ctx: JobContext) -> None:
        pass

    jobs: dict[str, tuple[Callable[..., Any], bool, bool]] = {
        "noop": (noop, False, True),
        "sync_ctx": (sync_ctx, True, False),
        "bare": (bare, True, True),
        "with_default": (with_default, True, True),
        "configured": (functools.partial(configured, "eu"), True, True),
    }
    for name, (func, takes_ctx, is_async) in jobs.items():
        job = scheduler.add_job(func, Every(hours=1), name=name)
        assert (job.takes_context, job.is_async) == (takes_ctx, is_async), name


@pytest.mark.parametrize(
    "timeout", [0, -1, float("inf"), float("nan"), "5", True, timedelta(0), 10**400]
)
def test_bad_timeout_is_an_error(timeout: object) -> None:
    """timeout= must be a positive number of seconds or a timedelta."""
    with pytest.raises(ConfigurationError, match="timeout="):
        Scheduler().every(hours=1, timeout=timeout)(noop)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, "5", True, float("inf"), float("nan")])
def test_bad_shutdown_timeout_is_an_error(value: object) -> None:
    """shutdown_timeout must be a finite duration >= 0, or None."""
    with pytest.raises(ConfigurationError, match="shutdown_timeout="):
        Scheduler(shutdown_timeout=value)  # type: ignore[arg-type]
    assert Scheduler(shutdown_timeout=0).shutdown_timeout == 0
    assert Scheduler(shutdown_timeout=timedelta(minutes=1)).shutdown_timeout == 60


def test_cron_schedule_object_equality() -> None:
    """Schedules compare by value (handy in tests of declarations)."""
    assert Cron("0 7 * * *", tz="UTC") == Cron("0  7 * * *")
    assert Every(minutes=60) == Every(hours=1)
    assert Every(hours=1) != Every(hours=1, offset=5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"days": 10**9}, "too long"),
        ({"days": 10**7}, "too long"),
        ({"seconds": float("nan")}, "finite"),
        ({"hours": "1"}, "not a duration"),
        ({"minutes": True}, "not a duration"),
        ({"hours": 1, "offset": float("nan")}, "offset=nan: must be a finite"),
        ({"hours": 1, "offset": "5"}, "offset='5': not a duration"),
        ({"hours": 1, "offset": -1}, "offset=-1: must be >= 0"),
        ({"hours": 1, "offset": 3600}, "shorter than the interval"),
    ],
)
def test_bad_intervals_fail_with_a_configuration_error(
    options: dict[str, Any], message: str
) -> None:
    """Wrong types and values of every() fail as ConfigurationError, never as a raw
    OverflowError or TypeError, and no interval makes ticks leave the datetime range."""
    with pytest.raises(ConfigurationError, match=message):
        Scheduler().every(**options)


def test_the_longest_interval_still_has_a_next_tick_as_a_date() -> None:
    """A 100-year interval is accepted and its next tick is a datetime."""
    from datetime import UTC, datetime

    schedule = Every(days=36524)
    assert schedule.next_datetime(datetime.now(UTC)).year < 9999


def test_every_without_parentheses_says_how_to_write_it() -> None:
    """@scheduler.every without parentheses is explained, like cron."""
    with pytest.raises(ConfigurationError, match=r"@scheduler.every\(hours=1\) \(with parentheses"):
        Scheduler().every(noop)


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        (5, "write @scheduler.every(seconds=5) (or minutes=, hours=, days=)"),
        (0.5, "write @scheduler.every(seconds=0.5) (or minutes=, hours=, days=)"),
        (timedelta(minutes=5), "write @scheduler.every(seconds=300) (or minutes="),
        ("5m", "write e.g. @scheduler.every(minutes=5) (seconds=, minutes=, hours=, days=)"),
    ],
)
def test_every_given_the_interval_by_position_says_which_keyword(given: object, hint: str) -> None:
    """@scheduler.every(5) has its parentheses: the hint names the keyword to
    write (seconds=5), not the parentheses."""
    with pytest.raises(ConfigurationError) as caught:
        Scheduler().every(given)
    assert hint in str(caught.value)
    assert "parentheses" not in str(caught.value)


@pytest.mark.parametrize(
    ("alias", "expr"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@ANNUALLY", "0 0 1 1 *"),
    ],
)
def test_cron_at_names_are_the_usual_expressions(alias: str, expr: str) -> None:
    """cron('@daily') and the other @ names of Vixie cron work."""
    assert Cron(alias) == Cron(expr)


def test_cron_at_reboot_points_to_run_on_startup() -> None:
    """@reboot is no schedule: the error says to use run_on_startup=True."""
    with pytest.raises(ConfigurationError, match="run_on_startup=True"):
        Scheduler().cron("@reboot")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"store": "sqlite+aiosqlite:///jobs.db"}, r"wrap it: store=SQLAlchemyStore\(url\)"),
        ({"store": object()}, "is not a store"),
        ({"logger": "myapp"}, "pass a logging.Logger"),
        ({"clock": 5}, "is not a Clock"),
        ({"lifespan": "resources"}, "lifespan function"),
    ],
)
def test_wrong_scheduler_parts_fail_at_once(options: dict[str, Any], message: str) -> None:
    """A Scheduler part of the wrong kind fails when made, not at startup."""
    with pytest.raises(ConfigurationError, match=message):
        Scheduler(**options)


@pytest.mark.parametrize("option", ["every_instance", "paused", "run_on_startup", "retry_timeouts"])
@pytest.mark.parametrize("value", ["false", 0, None])
def test_a_flag_is_a_bool(option: str, value: object) -> None:
    """A string read from the environment ("false") is true to Python: taken as
    given, it would turn on what was meant to be off. Refused, naming the job."""
    scheduler = Scheduler()
    with pytest.raises(ConfigurationError, match=f"job 'job': {option}=.*pass True or False"):
        scheduler.every(hours=1, **{option: value})(job)  # type: ignore[arg-type]


def test_a_public_control_router_is_said_with_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="public='false': pass True or False"):
        Scheduler().control_router(public="false")  # type: ignore[arg-type]


@pytest.mark.parametrize("observers", [5, "observer", None])
def test_observers_are_a_list(observers: object) -> None:
    with pytest.raises(ConfigurationError, match=r"pass a list of observers, e.g. observers=\["):
        Scheduler(observers=observers)  # type: ignore[arg-type]


async def test_an_error_in_the_running_block_comes_out_as_raised() -> None:
    """``async with scheduler.running():`` gives back the block's own exception,
    not the task group's ExceptionGroup around it."""
    scheduler = Scheduler()
    scheduler.every(hours=1)(job)
    with pytest.raises(LookupError, match="the block's own") as raised:
        async with scheduler.running():
            raise LookupError("the block's own")
    assert type(raised.value) is LookupError


async def job() -> None: ...


def test_a_job_is_made_only_through_its_checks() -> None:
    """``Job(...)`` called directly would skip every check (a name with a slash, a
    negative timeout): refused, saying how a job is made."""
    from fastapi_jobs import Job

    with pytest.raises(ConfigurationError, match=r"made by scheduler.add_job"):
        Job("a/b", job, Every(hours=1), -1, False, False, True)
    made = Scheduler().add_job(job, Every(hours=1), name="fine")
    assert made.name == "fine" and made.timeout is None


async def test_trigger_and_run_now_refuse_what_they_cannot_take() -> None:
    """``trigger(wait="yes")`` and ``run_now(state=5)`` were taken as given: a
    string for a flag, and a job's ``ctx.state`` that is not a mapping."""
    scheduler = Scheduler()
    scheduler.every(hours=1)(job)
    with pytest.raises(ConfigurationError, match="wait='yes': pass True or False"):
        await scheduler.trigger("job", wait="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"run_now\(state=5\): pass a mapping"):
        await scheduler.run_now("job", state=5)  # type: ignore[arg-type]
    assert (await scheduler.run_now("job", state={"db": None})).ok
