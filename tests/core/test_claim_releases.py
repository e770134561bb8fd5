"""The claims and releases of a memory store, in virtual time: the releases a
claim finds gathered go before it, a release the store refuses is logged once,
and a warning about many jobs names five and counts the rest."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from fastapi_jobs import Every
from fastapi_jobs.stores import Ended
from fastapi_jobs.testing import MemoryStore

from ..conftest import virtual_scheduler

pytestmark = pytest.mark.looptime


async def test_a_release_gathered_when_the_next_tick_comes_goes_before_its_claim() -> None:
    """A run that ends a millisecond before its job's next tick has its release
    still gathered when that tick's claim goes: a store that cannot take both in
    one call gets the release first, so its own lease never refuses the tick."""
    scheduler = virtual_scheduler(store=MemoryStore())

    @scheduler.every(seconds=1)
    async def job() -> None:
        await anyio.sleep(0.999)

    async with scheduler.running():
        await anyio.sleep(3.5)
    status = scheduler.job_status("job")
    assert (status.runs, status.skipped) == (3, {})


async def test_the_releases_of_other_jobs_gathered_beside_it_are_sent_too() -> None:
    """Of the releases gathered when a claim goes, those of the jobs it claims go
    first; those of other jobs are kept and sent with the next batch, so that
    their leases free their next ticks."""
    scheduler = virtual_scheduler(store=MemoryStore())

    @scheduler.every(seconds=1, run_on_startup=True)
    async def often() -> None:
        await anyio.sleep(0.999)

    @scheduler.every(seconds=5, run_on_startup=True)
    async def seldom() -> None:
        await anyio.sleep(0.9985)  # ends in the same gathering as often's first run

    async with scheduler.running():
        await anyio.sleep(5.5)
    status = scheduler.job_status("seldom")
    assert (status.runs, status.skipped) == (2, {})


class RefusingReleases(MemoryStore):
    """A memory store that refuses every release, as a database refuses a value
    it cannot store; it counts the releases it is sent."""

    sent = 0

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        self.sent += len(ended)
        return {end.job: ValueError("a value it cannot store") for end in ended}


async def test_a_release_the_store_refuses_is_logged_and_not_sent_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A release the store refuses is logged, with the job and the store's
    error, and never sent again: sending it again would fail again."""
    store = RefusingReleases()
    scheduler = virtual_scheduler(store=store)

    @scheduler.every(seconds=10, run_on_startup=True)
    async def job() -> None: ...

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(1)
    refused = [r.getMessage() for r in caplog.records if "refused the release" in r.getMessage()]
    assert refused == [
        "the database refused the release of 'job' (ValueError('a value it cannot store')); "
        "each frees when its lease ends"
    ]
    assert store.sent == 1


class FailingOnce(MemoryStore):
    """A memory store whose first release fails, as a database briefly down."""

    failed = False

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        if not self.failed:
            self.failed = True
            raise ConnectionError("down")
        return await super().release(ended)


async def test_a_release_that_fails_is_logged_and_sent_before_the_next_claim(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A release that fails is logged with the jobs it frees, and sent again
    before the job's next claim, which it would otherwise find held."""
    scheduler = virtual_scheduler(store=FailingOnce())

    @scheduler.every(seconds=10, run_on_startup=True)
    async def job() -> None: ...

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(11)
        status = scheduler.job_status("job")
    assert (status.runs, status.skipped) == (2, {})
    [failed] = [r.getMessage() for r in caplog.records if "could not release" in r.getMessage()]
    assert failed == (
        "could not release the claims of 'job' (ConnectionError('down')); retried before "
        "the next claim, or each frees when its lease ends"
    )


class BothInOneCall(MemoryStore):
    """A memory store that takes the releases and the claim in one call, as the
    SQL store does (``release_then_claim``); ``refuse``: every release refused."""

    refuse = False

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        if self.refuse:
            return {end.job: ValueError("a value it cannot store") for end in ended}
        return await super().release(ended)

    async def release_then_claim(
        self, ended: Sequence[Ended], wanted: Any, **options: Any
    ) -> tuple[dict[str, Exception], dict[str, int | Exception]]:
        return await self.release(ended), await self.claim(wanted, **options)


async def test_a_claim_that_carries_releases_keeps_its_own_arguments() -> None:
    """A stored schedule's claim that carries the release of its run before it
    (a run that ended a millisecond before its next tick) is still made under
    the schedule's version: each tick runs."""
    scheduler = virtual_scheduler(store=BothInOneCall())

    @scheduler.task()
    async def work() -> None:
        await anyio.sleep(0.999)

    async with scheduler.running():
        await scheduler.add_schedule("stored", work, Every(seconds=1))
        await anyio.sleep(3.5)
        status = scheduler.job_status("stored")
    assert (status.runs, status.skipped) == (3, {})


async def test_a_release_refused_in_a_claims_call_is_logged_as_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A release the store refuses in the claim's own call is logged as refused;
    the claim beside it went through (the store is not said unreachable)."""
    store = BothInOneCall()
    store.refuse = True
    scheduler = virtual_scheduler(store=store)

    @scheduler.every(seconds=1, run_on_startup=True)
    async def job() -> None:
        await anyio.sleep(0.999)

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(1.5)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("the database refused the release of 'job'") for m in said)
    assert not [m for m in said if "unreachable" in m]


class Unreachable(MemoryStore):
    """A memory store whose every claim fails, as a database that is down."""

    async def claim(self, *args: Any, **kwargs: Any) -> dict[str, int | Exception]:
        raise ConnectionError("down")


@pytest.mark.parametrize(
    ("count", "named"),
    [
        (5, "'job1', 'job2', 'job3', 'job4', 'job5'"),
        (7, "{long}, 'job2', 'job3', 'job4', 'job5' and 2 more"),
    ],
)
async def test_a_warning_about_many_jobs_names_five_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture, count: int, named: str
) -> None:
    """A claim that cannot reach the store is one warning that names five jobs,
    each name cut to about 40 characters, and counts the others."""
    scheduler = virtual_scheduler(store=Unreachable())
    names = [f"job{i}" for i in range(1, count + 1)]
    if count > 5:
        names[0] = "j" * 45
    for name in names:
        scheduler.every(seconds=10, name=name)(_nothing)

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(11)
    [warning] = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    long = "'" + "j" * 39 + "… (45 characters)"
    assert warning == (
        f"store unreachable, tick skipped for {count} job(s) ({named.format(long=long)}): "
        "ConnectionError('down')"
    )


async def _nothing() -> None: ...
