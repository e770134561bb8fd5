"""The store after a fault of the database: a table dropped under running
instances (every table, batches of one row and of several), and a release whose
second statement fails on SQLite."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import TypeVar

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fastapi_jobs import Every, Scheduler
from fastapi_jobs.stores import Ended, Instance, SQLAlchemyStore

from ..support.waiting import poll
from .test_store import opened

T = TypeVar("T")
NOW = 1_000.0  # ticks far in the database clock's past: claimable
TABLES = ["claims", "runs", "pauses", "instances"]


async def drop(engine: AsyncEngine, table: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(sa.text(f"DROP TABLE fastapi_jobs_{table}"))


async def claims_table(engine: AsyncEngine) -> dict[str, int]:
    """Each job's latest fence."""
    async with engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT job, fence FROM fastapi_jobs_claims"))
        return {job: fence for job, fence in rows.all()}


async def again(operation: Callable[[], Awaitable[T]]) -> T:
    """``operation()``, sent once more if it failed as a whole (as the scheduler
    sends a failed release again, and claims again at the next tick)."""
    try:
        return await operation()
    except sa.exc.DBAPIError:
        return await operation()


@pytest.mark.parametrize("jobs", [1, 5])
@pytest.mark.parametrize("table", TABLES)
async def test_a_dropped_table_fails_the_statement_whole_and_is_made_again(
    database_url: str, table: str, jobs: int
) -> None:
    """A table dropped under an open store: the statement that meets its absence
    fails as a whole (none of its rows is "refused", which would drop a release
    or fail each claim alone while the store went on trusting the tables), and
    the same operation sent again finds the table made again; the release lands
    in the history."""
    names = [f"job{k}" for k in range(jobs)]
    async with opened(database_url) as (store, engine):
        await store.beat()
        assert await store.claim([(name, NOW) for name in names]) == dict.fromkeys(names, 1)
        await drop(engine, table)

        refused = await again(
            lambda: store.release([Ended(name, 1, "ok", None, 0.1) for name in names])
        )
        fences = await again(lambda: store.claim([(name, NOW + 1) for name in names]))
        await again(store.beat)
        history = await store.recent_runs(names, 5)
    assert refused == {}
    # A claims table made again starts each job over; the others keep the fences.
    assert fences == dict.fromkeys(names, 1 if table == "claims" else 2)
    # The release found no claim to end in a new claims table: no history row.
    landed = [] if table == "claims" else [1]
    assert {name: [run.fence for run in runs] for name, runs in history.items()} == dict.fromkeys(
        names, landed
    )


@pytest.mark.parametrize("jobs", [1, 5])
@pytest.mark.parametrize("table", TABLES)
async def test_runs_resume_at_once_after_a_table_is_dropped(
    database_url: str, table: str, jobs: int
) -> None:
    """A scheduler running jobs every 0.2 s (claimed and released together when
    there are several) loses a table: runs go on within a tick or two, not after
    a 30 s lease nor at the next heartbeat, and every release after the drop is
    in the history once the table is back, none lost."""
    store = SQLAlchemyStore(
        database_url,
        lease=30,
        timeout=2,
        # A heartbeat that fails makes the tables again: it must not be what
        # rescues the claims here. The instances table only a heartbeat touches.
        heartbeat=0.3 if table == "instances" else 60,
    )
    scheduler = Scheduler(store=store)
    names = [f"job{k}" for k in range(jobs)]

    async def job() -> None: ...

    for name in names:
        scheduler.add_job(job, Every(seconds=0.2), name=name)
    engine = create_async_engine(database_url)  # the test's own connections
    try:
        await run_through_a_drop(scheduler, store, engine, table, names)
    finally:
        await engine.dispose()


async def run_through_a_drop(
    scheduler: Scheduler, store: SQLAlchemyStore, engine: AsyncEngine, table: str, names: list[str]
) -> None:
    async with scheduler.running():
        await poll(lambda: all(scheduler.job_status(name).runs >= 2 for name in names))
        await drop(engine, table)
        claimed = {} if table == "claims" else await claims_table(engine)
        before = {name: scheduler.job_status(name).runs for name in names}
        await poll(
            lambda: all(scheduler.job_status(name).runs >= before[name] + 3 for name in names),
            within=15,
        )
        if table == "instances":

            async def listed() -> bool:
                view = await store.read()
                return [i.id for i in view.instances] == [store._owner]

            await poll(listed)
    # Stopped: the last releases are sent.
    last = await claims_table(engine)
    async with engine.connect() as conn:
        rows = (
            await conn.execute(sa.text("SELECT job, fence FROM fastapi_jobs_runs ORDER BY id"))
        ).all()
    for name in names:
        fences = [fence for job_, fence in rows if job_ == name]
        if table == "claims":  # the fences start over with the new table
            fences = fences[len(fences) - 1 - fences[::-1].index(1) :]
        assert fences == list(range(fences[0], last[name] + 1)), (name, fences, last)
        if table == "runs":  # a new history, from the first release after the drop
            assert fences[0] <= claimed[name] + 1, (name, fences, claimed)
        else:
            assert fences[0] == 1, (name, fences)


class SlowToFree(SQLAlchemyStore):
    """A store that frees the claims of an abandoned claim operation only once
    the test lets it (the freeing looks up what the operation may have made)."""

    go: asyncio.Event

    async def _free_claims(self, made: list[tuple[str, int]], unanswered: dict[str, float]) -> None:
        await self.go.wait()
        await super()._free_claims(made, unanswered)


@pytest.mark.parametrize("jobs", [1, 5])
async def test_a_claim_statement_that_failed_frees_no_claim_made_since(
    database_url: str, jobs: int
) -> None:
    """A claim whose statement the database refused made nothing: the store does
    not look for claims it might have made, which would find (and end) the claim
    of the same tick made right after by the same instance."""
    names = [f"job{k}" for k in range(jobs)]
    async with opened(database_url) as (seed, engine):
        await seed.claim([(name, NOW) for name in names])
        await seed.release([Ended(name, 1, "ok", None, 0.1) for name in names])
        store = SlowToFree(engine)
        store.go = asyncio.Event()
        await store.open({}, Instance())
        try:
            await store.beat()  # its tables checked
            await drop(engine, "pauses")  # which the claim statement reads
            with pytest.raises(sa.exc.DBAPIError, match="pauses"):
                await store.claim([(name, NOW + 1) for name in names])
            assert await store.claim([(name, NOW + 1) for name in names]) == dict.fromkeys(names, 2)
            store.go.set()
        finally:
            await store.close()  # once every operation of the store has ended
        view = await seed.read()
    assert {name: view.jobs[name].running_on for name in names} == dict.fromkeys(
        names, store._owner
    )


async def test_a_release_whose_second_statement_fails_writes_one_history_row(
    tmp_path: Path,
) -> None:
    """SQLite writes a release's history row and ends its claim in two statements:
    when the second fails, the first is undone with it, so the release sent again
    writes the history row once."""
    path = tmp_path / "jobs.sqlite3"
    async with opened(f"sqlite+aiosqlite:///{path}") as (store, _):
        assert await store.claim([("a", NOW), ("b", NOW)]) == {"a": 1, "b": 1}
        with closing(sqlite3.connect(path)) as conn:
            # The release's UPDATE of the claims fails, as a lock or a full disk would.
            conn.execute(
                "CREATE TRIGGER fail_release BEFORE UPDATE ON fastapi_jobs_claims "
                "BEGIN SELECT RAISE(ABORT, 'the disk is full'); END"
            )
            conn.commit()
        ended = [Ended("a", 1, "ok", None, 0.1), Ended("b", 1, "failed", "E: x", 0.2)]
        try:
            failed = set(await store.release(ended))
        except sa.exc.DBAPIError:
            failed = {"a", "b"}
        assert failed == {"a", "b"}
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("DROP TRIGGER fail_release")
            conn.commit()
        assert await store.release(ended) == {}
        history = await store.recent_runs(["a", "b"], 10)
        view = await store.read()
    assert {job: [run.fence for run in runs] for job, runs in history.items()} == {
        "a": [1],
        "b": [1],
    }
    assert view.jobs["b"].last_outcome == "failed" and view.jobs["a"].running_on is None
