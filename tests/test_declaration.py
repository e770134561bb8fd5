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


@pytest.mark.parametrize("bad_name", ["", "  ", "a/b"])
def test_unusable_names_are_refused(bad_name: str) -> None:
    """Names show up in URLs: empty names and slashes are refused."""
    with pytest.raises(ConfigurationError, match="not usable"):
        Scheduler().add_job(noop, Every(hours=1), name=bad_name)


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


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), "5", timedelta(0)])
def test_bad_timeout_is_an_error(timeout: object) -> None:
    """timeout= must be a positive number of seconds or a timedelta."""
    with pytest.raises(ConfigurationError, match="timeout="):
        Scheduler().every(hours=1, timeout=timeout)(noop)  # type: ignore[arg-type]


def test_bad_shutdown_timeout_is_an_error() -> None:
    """shutdown_timeout must be >= 0 or None."""
    with pytest.raises(ConfigurationError, match="shutdown_timeout"):
        Scheduler(shutdown_timeout=-1)
    assert Scheduler(shutdown_timeout=timedelta(minutes=1)).shutdown_timeout == 60


def test_cron_schedule_object_equality() -> None:
    """Schedules compare by value (handy in tests of declarations)."""
    assert Cron("0 7 * * *", tz="UTC") == Cron("0  7 * * *")
    assert Every(minutes=60) == Every(hours=1)
    assert Every(hours=1) != Every(hours=1, offset=5)
