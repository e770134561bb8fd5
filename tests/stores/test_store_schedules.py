"""Schedules as data in a store, on every backend: the table, the claim's
version check, two schedulers sharing a database (a change on one followed by
the other within a heartbeat, each tick run once), restarts, an instance that
lacks the task, and a store without the table."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from fastapi_jobs import (
    ConfigurationError,
    Every,
    JobContext,
    JobNotFoundError,
    ScheduleChangedError,
    Scheduler,
    StoreError,
)
from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import serve
from ..project.test_docs import blocks
from ..support.waiting import poll
from .test_store import opened

HEARTBEAT = 0.2


# -- the table and the claim's check -------------------------------------------


def _changed(answer: object, tick: float) -> bool:
    """Whether a claim's answer says its schedule changed under ``tick``."""
    return (
        isinstance(answer, dict)
        and list(answer) == ["s"]
        and isinstance(answer["s"], ScheduleChangedError)
        and answer["s"].tick == tick
    )


async def test_a_stored_schedules_tick_is_claimed_only_under_its_version(
    database_url: str,
) -> None:
    """A stored schedule's tick is claimed only under the version its row has;
    one asked under another (changed or removed since) is answered
    ScheduleChangedError, not left out as if claimed elsewhere."""
    async with opened(database_url) as (store, _):
        row = await store.schedules.create("s", "report", '{"x":1}')
        assert row is not None and not row.removed and row.version > 0
        assert await store.schedules.create("s", "report", "{}") is None  # taken
        v1 = row.version
        assert _changed(await store.claim([("s", 10.0)], versions={"s": v1 + 1}), 10.0)
        assert set(await store.claim([("s", 10.0)], versions={"s": v1})) == {"s"}
        changed = await store.schedules.change("s", "report", '{"x":2}', v1)
        assert changed is not None and changed.version > v1
        assert await store.schedules.change("s", "report", "{}", v1) is None  # moved on
        # Under the row's version, a tick not newer than the last is no answer (held).
        assert await store.claim([("s", 10.0)], versions={"s": changed.version}) == {}
        assert _changed(await store.claim([("s", 20.0)], versions={"s": v1}), 20.0)  # the old spec
        removed = await store.schedules.remove("s")
        assert removed is not None and removed.removed and removed.version > changed.version
        assert await store.schedules.remove("s") is None
        assert _changed(await store.claim([("s", 30.0)], versions={"s": changed.version}), 30.0)
        # Made again under the same name: its version goes on growing.
        again = await store.schedules.create("s", "other", "{}")
        assert again is not None and again.version > removed.version and again.task == "other"


async def test_a_declared_job_is_not_claimed_under_a_live_stored_schedules_name(
    database_url: str,
) -> None:
    async with opened(database_url) as (store, _):
        await store.schedules.create("clash", "report", "{}")
        assert set(await store.claim([("clash", 10.0), ("free", 10.0)])) == {"free"}
        await store.schedules.remove("clash")
        assert set(await store.claim([("clash", 20.0)])) == {"clash"}  # a removal's row


async def test_changes_are_read_from_a_version_on(database_url: str) -> None:
    async with opened(database_url) as (store, _):
        for n in range(50):
            await store.schedules.create(f"s{n}", "report", "{}")
        everything = await store.schedules.changes(0)
        assert len(everything) == 50
        last = everything[-1].version
        changed = await store.schedules.change("s7", "report", '{"a":1}', everything[7].version)
        await store.schedules.remove("s9")
        rows = await store.schedules.changes(last + 1)
        assert [(r.name, r.removed) for r in rows] == [("s7", False), ("s9", True)]
        assert changed is not None and rows[0].version == changed.version
        assert len(await store.schedules.changes(0)) == 49  # a full read skips removals


# -- two schedulers on one database ----------------------------------------------


Runs = Counter[tuple[str, float]]
"""Runs by (tenant, tick as POSIX seconds)."""


def instance(url: str, ran: Runs, *, task: bool = True) -> Scheduler:
    # From the URL: the store owns the engine, and disposes of it when it closes.
    store = SQLAlchemyStore(url, heartbeat=HEARTBEAT, lease=10, timeout=2)
    scheduler = Scheduler(store=store, shutdown_timeout=5)
    if task:

        @scheduler.task()
        async def report(ctx: JobContext, tenant: str) -> None:
            ran[tenant, ctx.tick.timestamp()] += 1

    return scheduler


@asynccontextmanager
async def running(*schedulers: Scheduler) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for scheduler in schedulers:
            await stack.enter_async_context(scheduler.running())
        yield


def names(scheduler: Scheduler) -> set[str]:
    return {status.name for status in scheduler.status()}


# A tick this long after a change's commit is claimed after it (instances claim
# a tick when it comes, on the database's clock).
_AFTER = 0.2


async def test_a_schedule_made_on_one_instance_runs_once_per_tick_on_both(
    database_url: str,
) -> None:
    ran: Runs = Counter()
    a, b = instance(database_url, ran), instance(database_url, ran)
    async with running(a, b):
        await a.add_schedule("acme", "report", Every(seconds=0.5), kwargs={"tenant": "acme"})
        await poll(lambda: "acme" in names(b))  # within a heartbeat
        await poll(lambda: len(ran) >= 4, within=20)
        changed = await b.update_schedule("acme", kwargs={"tenant": "zeta"})
        assert changed.updated_at is not None
        changed_at = changed.updated_at.timestamp()
        await poll(lambda: sum(1 for t, _ in ran if t == "zeta") >= 4, within=20)
        await a.remove_schedule("acme")
        removed_at = time.time()
        await poll(lambda: "acme" not in names(a) | names(b))
        await anyio.sleep(1.2)  # two ticks' worth: none runs
    assert all(count == 1 for count in ran.values()), ran  # each tick once across the two
    assert {t for t, tick in ran if tick > changed_at + _AFTER} == {"zeta"}
    assert [tick for _, tick in ran if tick > removed_at + _AFTER] == []


async def test_schedules_are_back_after_every_instance_restarts(database_url: str) -> None:
    ran: Runs = Counter()
    a = instance(database_url, ran)
    async with running(a):
        await a.add_schedule("kept", "report", Every(hours=1), kwargs={"tenant": "k"}, retries=2)
    again = instance(database_url, ran)
    async with running(again):
        schedules = await again.schedules()
        status = again.job_status("kept")
    assert [(s.name, s.kwargs, s.options, s.known) for s in schedules] == [
        ("kept", {"tenant": "k"}, {"retries": 2}, True)
    ]
    assert status.schedule == "every 1h"


async def test_an_instance_without_the_task_leaves_the_schedule_alone(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: Runs = Counter()
    new, old = instance(database_url, ran), instance(database_url, ran, task=False)
    caplog.set_level(logging.WARNING, logger="fastapi_jobs")
    async with running(new, old):
        await new.add_schedule("t", "report", Every(seconds=0.3), kwargs={"tenant": "t"})
        await poll(lambda: len(ran) >= 4, within=20)
        listed = await old.schedules()
        with pytest.raises(JobNotFoundError):
            old.job_status("t")
    assert [(s.name, s.known) for s in listed] == [("t", False)]
    left_alone = [r for r in caplog.records if "is left alone here" in r.getMessage()]
    assert len(left_alone) == 1  # said once, not at every beat
    assert "names the task 'report', which this instance lacks" in left_alone[0].getMessage()
    async with opened(database_url) as (store, _):
        assert [r.name for r in await store.schedules.changes(0)] == ["t"]  # not deleted


def reads_counted(store: SQLAlchemyStore) -> list[int]:
    """The number of rows each read of the changes returns (the real read, spied on)."""
    counts: list[int] = []
    changes = store.schedules.changes

    async def counted(since: int) -> list[Any]:
        rows = await changes(since)
        counts.append(len(rows))
        return rows

    store.schedules.changes = counted  # type: ignore[method-assign]
    return counts


@pytest.mark.slow  # 7 s a backend of real heartbeats: .ci/run's slow pass
async def test_a_burst_of_schedules_is_not_read_again_at_every_beat(database_url: str) -> None:
    """Schedules made at once (an import makes thousands) are read again by the
    heartbeats only while a change stamped before them may still commit (three
    store timeouts), not at every beat until the next change comes. (A timeout
    of 2 s: 20 changes in a row must each get through on a loaded machine.)"""
    store = SQLAlchemyStore(database_url, heartbeat=HEARTBEAT, lease=10, timeout=2)
    scheduler = Scheduler(store=store, shutdown_timeout=5)

    @scheduler.task()
    async def report(tenant: str) -> None: ...

    reads = reads_counted(store)
    async with running(scheduler):
        for n in range(20):
            await scheduler.add_schedule(f"s{n}", "report", Every(hours=1), kwargs={"tenant": "t"})
        await poll(lambda: reads[-3:] == [0, 0, 0], within=15)
        assert len(scheduler.status()) == 20


async def test_a_change_that_commits_after_a_read_past_its_version_is_applied(
    database_url: str,
) -> None:
    """A change stamped before a heartbeat's read but committed after it (a slow
    commit, within the store's deadline) is applied at a later beat."""
    store = SQLAlchemyStore(database_url, heartbeat=HEARTBEAT, lease=10, timeout=0.5)
    scheduler = Scheduler(store=store, shutdown_timeout=5)

    @scheduler.task()
    async def report(tenant: str) -> None: ...

    reads = reads_counted(store)
    spec = '{"kwargs":{"tenant":"l"},"options":{},"schedule":{"every":3600.0,"offset":0.0}}'
    async with running(scheduler):
        await scheduler.add_schedule("first", "report", Every(hours=1), kwargs={"tenant": "f"})
        beats = len(reads)
        await poll(lambda: len(reads) > beats + 1)  # read past the moment stamped below
        stamped = int((time.time() - 0.4) * 1e6)
        async with opened(database_url) as (_, engine), engine.begin() as conn:
            row = {"name": "late", "task": "report", "spec": spec, "removed": False}
            values = {**row, "version": stamped, "updated_at": stamped / 1e6}
            await conn.execute(sa.insert(store.tables.schedules).values(**values))
        await poll(lambda: "late" in names(scheduler))


# -- bad input and a store that cannot -------------------------------------------


async def test_a_store_without_the_table_runs_and_refuses_schedules_saying_why(
    database_url: str,
) -> None:
    async with opened(database_url) as (store, engine):
        await store.claim([("warm", 1.0)])  # tables made
        async with engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE fastapi_jobs_schedules"))
    ran: Runs = Counter()
    scheduler = Scheduler(
        store=SQLAlchemyStore(database_url, create_tables=False, heartbeat=HEARTBEAT)
    )

    @scheduler.task()
    async def report(tenant: str) -> None: ...

    @scheduler.every(seconds=0.2)
    async def declared() -> None:
        ran["declared", 0.0] += 1

    async with running(scheduler):
        with pytest.raises(StoreError, match="fastapi_jobs_schedules does not exist"):
            await scheduler.add_schedule("x", "report", Every(hours=1), kwargs={"tenant": "a"})
        assert await scheduler.schedules() == []
        await poll(lambda: sum(ran.values()) >= 2)


async def test_a_write_to_a_store_that_is_down_changes_nothing(database_url: str) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("a SQLite file is not a server that goes away")
    scheduler = Scheduler(
        store=SQLAlchemyStore(database_url.rsplit("/", 1)[0] + "/no_such_database", timeout=0.5)
    )

    @scheduler.task()
    async def report(tenant: str) -> None: ...

    async with running(scheduler):
        with pytest.raises(StoreError, match=r"cannot create schedule 'x'.*nothing changed"):
            await scheduler.add_schedule("x", "report", Every(hours=1), kwargs={"tenant": "a"})
        with pytest.raises(ConfigurationError, match="no task named"):
            await scheduler.add_schedule("x", "nope", Every(hours=1))
        with pytest.raises(StoreError, match=r"cannot read the schedules: .*nothing changed"):
            await scheduler.schedules()
        with pytest.raises(StoreError, match=r"cannot change schedule 'x': the store could not"):
            await scheduler.update_schedule("x", kwargs={"tenant": "b"})
        with pytest.raises(StoreError, match=r"cannot remove schedule 'x'.*nothing changed"):
            await scheduler.remove_schedule("x")
        assert "x" not in scheduler.jobs


# -- the docs' example ---------------------------------------------------------


async def test_the_tenant_example_makes_changes_and_removes_over_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/guides/schedules.md's app, as its reader runs it: PUT makes the tenant's
    schedule and re-times it, bad input is a 422, DELETE removes it, and the
    schedule is back in a second start of the app."""
    # The page's first app (the tenants' API); the second applies a set.
    code = next(c for p, c in blocks("python") if p.name == "schedules.md" and "app =" in c)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBS_TOKEN", "t")
    admin = ("admin", "t")

    def load() -> Any:
        namespace: dict[str, Any] = {"__name__": "docs_schedules"}
        exec(compile(code, "docs/guides/schedules.md", "exec"), namespace)
        return namespace

    first = load()
    async with serve(first["app"]) as client:
        body = {"hour": 7, "tz": "Europe/Lisbon", "recipients": ["ops@acme.example"]}
        assert (await client.put("/tenants/acme/report", json=body)).status_code == 401
        made = await client.put("/tenants/acme/report", json=body, auth=admin)
        assert made.status_code == 200, made.text
        assert made.json()["schedule"] == {"cron": "0 7 * * *", "tz": "Europe/Lisbon"}
        retimed = await client.put("/tenants/acme/report", json={**body, "hour": 9}, auth=admin)
        assert retimed.json()["version"] > made.json()["version"]
        bad = await client.put(
            "/tenants/acme/report", json={**body, "tz": "Mars/Olympus"}, auth=admin
        )
        assert bad.status_code == 422 and "unknown timezone 'Mars/Olympus'" in bad.text
        await client.put("/tenants/zeta/report", json=body, auth=admin)
        jobs = {job["name"]: job for job in (await client.get("/jobs", auth=admin)).json()}
        assert jobs["report:acme"]["task"] == "tenant_report"
        assert jobs["report:acme"]["schedule"].startswith("cron '0 9 * * *' Europe/Lisbon")
        assert (await client.delete("/tenants/zeta/report", auth=admin)).status_code == 204
        assert (await client.delete("/tenants/zeta/report", auth=admin)).status_code == 404
    second = load()
    async with serve(second["app"]):
        stored = await second["scheduler"].schedules()
    assert [(s.name, s.kwargs["recipients"]) for s in stored] == [
        ("report:acme", ["ops@acme.example"])
    ]


async def test_a_removal_repeated_where_the_first_is_not_heard_of_yet_says_so(
    database_url: str,
) -> None:
    """A removes 't1'; B, whose heartbeat has not read that yet, is asked to
    remove it too: not found, and the answer does not list 't1' among the
    schedules it says there are."""
    ran: Runs = Counter()
    a = instance(database_url, ran)
    b = Scheduler(store=SQLAlchemyStore(database_url, heartbeat=60, lease=10, timeout=2))

    @b.task()
    async def report(ctx: JobContext, tenant: str) -> None: ...

    async with running(a, b):
        await a.add_schedule("t1", "report", Every(hours=1), kwargs={"tenant": "x"})
        await a.add_schedule("t2", "report", Every(hours=1), kwargs={"tenant": "y"})
        await b.schedules()  # B reads both now; its next read is a minute away
        await a.remove_schedule("t1")
        with pytest.raises(JobNotFoundError) as raised:
            await b.remove_schedule("t1")
    said = str(raised.value)
    assert "no schedule named 't1'" in said and "the schedules are: 't2'" in said, said


async def test_a_spec_this_release_cannot_read_is_listed_and_left_alone(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A row written by a newer release (or by hand): listed as unknown, not run,
    not deleted, said once."""
    async with opened(database_url) as (store, _):
        await store.schedules.create("newer", "report", '{"schedule":{"weekly":1},"kwargs":{}}')
    ran: Runs = Counter()
    scheduler = instance(database_url, ran)
    caplog.set_level(logging.WARNING, logger="fastapi_jobs")
    async with running(scheduler):
        listed = await scheduler.schedules()
        await scheduler.schedules()  # read again: said once
        assert "newer" not in scheduler.jobs
    assert [(s.name, s.known, s.to_dict()["schedule"]) for s in listed] == [("newer", False, None)]
    said = [r.getMessage() for r in caplog.records if "is left alone here" in r.getMessage()]
    assert len(said) == 1 and "cannot be read by this release" in said[0]


async def test_a_row_whose_kwargs_are_not_text_cannot_fail_the_listing(database_url: str) -> None:
    """A row whose kwargs hold a lone surrogate (valid JSON, written by hand or by
    an older release, which let it in), and one whose spec this release cannot
    read: GET /jobs/schedules answers on every instance, showing U+FFFD in the
    surrogate's place and no spec for the other, and the rows beside them."""
    async with opened(database_url) as (store, _):
        spec = '{"schedule":{"every":3600,"offset":0},"kwargs":{"tenant":"a\\ud800b"}}'
        await store.schedules.create("odd", "report", spec)
        await store.schedules.create("newer", "report", '{"schedule":{"weekly":1},"kwargs":{}}')
    ran: Runs = Counter()
    scheduler = instance(database_url, ran)
    async with running(scheduler):
        await scheduler.add_schedule("fine", "report", Every(hours=1), kwargs={"tenant": "ü"})
        app = FastAPI()
        app.include_router(scheduler.router)
        async with serve(app) as client:
            answer = await client.get("/jobs/schedules")
    assert answer.status_code == 200, answer.text
    listed = {s["name"]: (s["kwargs"], s["schedule"] is None) for s in answer.json()}
    assert listed == {
        "odd": ({"tenant": "a\ufffdb"}, False),
        "newer": ({}, True),
        "fine": ({"tenant": "ü"}, False),
    }


async def test_arguments_this_releases_task_does_not_take_leave_the_schedule_alone(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A release whose task renamed a parameter: the schedules made for the old
    one are left alone (said why), not run to fail at every tick."""
    ran: Runs = Counter()
    old = instance(database_url, ran)
    async with running(old):
        await old.add_schedule("r", "report", Every(hours=1), kwargs={"tenant": "a"})
    new = Scheduler(store=SQLAlchemyStore(database_url, heartbeat=HEARTBEAT))

    @new.task(name="report")
    async def renamed(ctx: JobContext, tenant_id: str) -> None: ...

    caplog.set_level(logging.WARNING, logger="fastapi_jobs")
    async with running(new):
        assert "r" not in new.jobs
        assert [(s.name, s.known) for s in await new.schedules()] == [("r", False)]
    said = [r.getMessage() for r in caplog.records if "is left alone here" in r.getMessage()]
    assert len(said) == 1 and "takes no argument 'tenant'" in said[0]


async def test_an_instance_acts_on_a_schedule_made_elsewhere_before_its_heartbeat(
    database_url: str,
) -> None:
    """A pause or a trigger of a name another instance just made reads the changes
    first: no 404 for a heartbeat's time."""
    ran: Runs = Counter()
    a = instance(database_url, ran)
    b = Scheduler(store=SQLAlchemyStore(database_url, heartbeat=60))

    @b.task()
    async def report(ctx: JobContext, tenant: str) -> None:
        ran[tenant, ctx.tick.timestamp()] += 1

    async with running(a, b):
        await a.add_schedule("fresh", "report", Every(hours=1), kwargs={"tenant": "f"})
        paused = await b.pause("fresh")
        assert paused.paused
        run = await b.trigger("fresh", wait=True)
        result = run.result()
        assert result is not None and result.ok
        with pytest.raises(JobNotFoundError):
            await b.pause("never-made")
    assert sum(n for (tenant, _), n in ran.items() if tenant == "f") == 1


class RemovedWhileRead(SQLAlchemyStore):
    """A store whose next reading for the status (``read``) lets a removal of the
    schedule ``removing`` be applied first, as a heartbeat may while it waits."""

    removing: tuple[Scheduler, str] | None = None
    read_jobs = None  # type: ignore[assignment]  # every status reading: through read()

    async def read(self) -> Any:
        if self.removing is not None:
            (scheduler, name), self.removing = self.removing, None
            await scheduler.remove_schedule(name)
        return await super().read()


async def test_a_job_status_asked_as_its_schedule_is_removed_is_not_found(
    tmp_path: Path,
) -> None:
    """GET /jobs/{name} of a stored schedule removed while the store is read for
    the status answers 404 (the job is gone), not a server error."""
    store = RemovedWhileRead(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}", timeout=2)
    scheduler = Scheduler(store=store, shutdown_timeout=5)

    @scheduler.task()
    async def report(ctx: JobContext, tenant: str) -> None:
        pass

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    async with serve(app) as client:
        await scheduler.add_schedule("acme", "report", Every(hours=1), kwargs={"tenant": "a"})
        assert (await client.get("/jobs/acme")).status_code == 200
        store.removing = (scheduler, "acme")
        response = await client.get("/jobs/acme")
        assert response.status_code == 404, response.text
        assert "no job named 'acme'" in response.json()["detail"]


async def test_an_older_release_beside_many_schedules_names_a_few_and_counts_the_rest(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """25 schedules of a task this release lacks: ten named in the log, then one
    line that counts the other fifteen (not a line each at every start)."""
    async with opened(database_url) as (store, _):
        for n in range(25):
            await store.schedules.create(
                f"s{n:02}", "gone", '{"schedule":{"every":60,"offset":0},"kwargs":{},"options":{}}'
            )
    older = Scheduler(store=SQLAlchemyStore(database_url, heartbeat=HEARTBEAT))
    caplog.set_level(logging.WARNING, logger="fastapi_jobs")
    async with running(older):
        listed = await older.schedules()
    said = [r.getMessage() for r in caplog.records if "left alone here" in r.getMessage()]
    assert len(said) == 11
    assert said[-1].startswith("and 15 more stored schedule(s) are left alone here")
    assert [s.known for s in listed] == [False] * 25
