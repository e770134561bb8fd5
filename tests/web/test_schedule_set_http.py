"""A group's schedules applied as a set over HTTP (``PUT /jobs/schedules?group=``
on the control router): made, changed, trimmed and left alone; thousands at
once into a SQLite file; what a bad set, a taken name and the bound get."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import serve
from ..core.test_operate import ADMIN
from ..support.postgres import PostgresServer
from .test_schedule_http import make_app, store_app, with_report


def tenant(t: str, every: float = 10, **extra: Any) -> dict[str, Any]:
    return {
        "name": f"report-{t}",
        "task": "report",
        "schedule": {"every": every},
        "kwargs": {"tenant": t},
        **extra,
    }


@pytest.mark.looptime
async def test_a_set_put_twice_is_made_once_and_a_smaller_one_trims_the_group() -> None:
    """The first PUT makes the set (and it runs); the same body again changes
    nothing; a body without one of them removes it, and changes what differs."""
    ran: list[tuple[str, float]] = []
    async with serve(make_app(with_report(ran))) as client:
        body = {"schedules": [tenant("acme"), tenant("globex")]}
        first = await client.put("/jobs/schedules?group=reports", json=body, headers=ADMIN)
        assert first.status_code == 200, first.text
        assert first.json() == {
            "group": "reports",
            "created": ["report-acme", "report-globex"],
            "changed": [],
            "removed": [],
            "unchanged": 0,
        }
        again = await client.put("/jobs/schedules?group=reports", json=body, headers=ADMIN)
        assert again.json()["unchanged"] == 2 and again.json()["created"] == []
        await anyio.sleep(15)  # each ran at 10
        trimmed = await client.put(
            "/jobs/schedules?group=reports",
            json={"schedules": [tenant("acme", every=20)]},
            headers=ADMIN,
        )
        assert trimmed.json()["changed"] == ["report-acme"]
        assert trimmed.json()["removed"] == ["report-globex"]
        listed = (await client.get("/jobs/schedules")).json()
        assert [(s["name"], s["group"]) for s in listed] == [("report-acme", "reports")]
        await anyio.sleep(7)  # to 22: acme at 20, on its new 20 s grid
    assert sorted(ran) == [("acme", 10.0), ("acme", 20.0), ("globex", 10.0)]


@pytest.mark.looptime
async def test_a_bad_set_is_one_answer_that_says_what_and_nothing_is_applied() -> None:
    """A group no job name could be, an item past the web form's bounds, an
    unknown task: 422; a name a schedule outside the group has: 409; the
    app's auth holds (401)."""
    async with serve(make_app(with_report([]))) as client:
        made = await client.post("/jobs/schedules", json=tenant("solo"), headers=ADMIN)
        assert made.status_code == 201
        body = {"schedules": [tenant("acme")]}
        assert (await client.put("/jobs/schedules?group=g", json=body)).status_code == 401
        missing = await client.put("/jobs/schedules", json=body, headers=ADMIN)
        assert missing.status_code == 422
        huge = "x" * 5_000
        for group, said in ((huge, "the group's name"), ("a/b", "no '/'")):
            refused = await client.put(
                "/jobs/schedules", params={"group": group}, json=body, headers=ADMIN
            )
            assert refused.status_code == 422 and said in refused.json()["detail"]
            assert huge not in refused.text
        for schedules, said in (
            ([tenant("acme", every=0.5)], "report-acme"),
            ([tenant("acme"), {**tenant("b"), "task": "nope"}], "no task named 'nope'"),
            ([tenant("acme"), tenant("acme")], "given twice"),
            ([{"name": "x"}], "schedules.0"),
        ):
            refused = await client.put(
                "/jobs/schedules?group=g", json={"schedules": schedules}, headers=ADMIN
            )
            assert refused.status_code == 422, refused.text
            assert said in refused.json()["detail"]
        taken = await client.put(
            "/jobs/schedules?group=g",
            json={"schedules": [tenant("acme"), tenant("solo")]},
            headers=ADMIN,
        )
        assert taken.status_code == 409 and "'report-solo'" in taken.json()["detail"]
        listed = (await client.get("/jobs/schedules")).json()
        assert [s["name"] for s in listed] == ["report-solo"]


@pytest.mark.looptime
async def test_a_set_past_max_schedules_is_409_saying_the_bound() -> None:
    scheduler = with_report([], max_schedules=3)
    async with serve(make_app(scheduler)) as client:
        body = {"schedules": [tenant(t) for t in "abcd"]}
        refused = await client.put("/jobs/schedules?group=g", json=body, headers=ADMIN)
        assert refused.status_code == 409
        assert "the most is 3 (Scheduler(max_schedules=))" in refused.json()["detail"]
        body = {"schedules": [tenant(t) for t in "abc"]}
        assert (await client.put("/jobs/schedules?group=g", json=body, headers=ADMIN)).is_success
        one_more = await client.post("/jobs/schedules", json=tenant("d"), headers=ADMIN)
        assert one_more.status_code == 409


async def test_thousands_are_applied_in_one_call_to_a_sqlite_file(tmp_path: Path) -> None:
    """5,000 schedules in one body land in the store in one call; applying the
    same body again writes nothing (the rows' versions kept)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    scheduler = with_report([], store=SQLAlchemyStore(url))
    body = {"schedules": [tenant(f"t{n:05}", every=3600) for n in range(5_000)]}
    engine = create_async_engine(url)
    query = sa.text("SELECT count(*), max(version), min(group_name) FROM fastapi_jobs_schedules")
    try:
        async with serve(make_app(scheduler)) as client:
            first = await client.put("/jobs/schedules?group=bulk", json=body, headers=ADMIN)
            assert first.status_code == 200, first.text
            assert len(first.json()["created"]) == 5_000
            async with engine.connect() as conn:
                count, version, group = (await conn.execute(query)).one()
            assert (count, group) == (5_000, "bulk")
            again = await client.put("/jobs/schedules?group=bulk", json=body, headers=ADMIN)
            assert again.json()["unchanged"] == 5_000
            async with engine.connect() as conn:
                assert (await conn.execute(query)).one() == (5_000, version, "bulk")
            assert len(scheduler.jobs) == 5_001  # and the declared one
    finally:
        await engine.dispose()


async def test_a_set_the_store_cannot_take_is_503_saying_nothing_changed(
    postgres: PostgresServer,
) -> None:
    """A store that is down: 503, nothing changed, the URL's password not shown."""
    url = postgres.url("no_such_database").replace("postgres@", "postgres:hunter2@")
    async with store_app(url, store_timeout=0.5) as client:
        answer = await client.put(
            "/jobs/schedules?group=g", json={"schedules": [tenant("acme")]}, headers=ADMIN
        )
    assert answer.status_code == 503
    detail = answer.json()["detail"]
    assert "cannot apply the schedules of group 'g'" in detail and "nothing changed" in detail
    assert "hunter2" not in detail and "postgresql" not in detail


@pytest.mark.looptime
async def test_what_a_hostile_set_gets_says_where_and_shows_no_secret_nor_its_input() -> None:
    """A value JSON cannot hold beside a password: the 422 names the schedule's
    place and hides the password; a zone past a file name's length, a task of a
    megabyte: 422s of a few hundred bytes, not a 500 nor the input echoed."""
    async with serve(make_app(with_report([]))) as client:
        nan = '{"schedules": [%s, {"name": "b", "task": "report", "schedule": {"every": 60}, '
        nan += '"kwargs": {"password": "hunter2", "tenant": NaN}}]}'
        sent = nan % json.dumps(tenant("a"))
        answer = await client.put(
            "/jobs/schedules?group=g",
            content=sent,
            headers={**ADMIN, "content-type": "application/json"},
        )
        assert answer.status_code == 422, answer.text
        assert "schedules[1]" in answer.json()["detail"] and "hunter2" not in answer.text
        huge_zone = {**tenant("a"), "schedule": {"cron": "0 7 * * *", "tz": "A" * 300}}
        huge_task = {**tenant("a"), "task": "t" * 1_000_000}
        for item in (huge_zone, huge_task):
            refused = await client.put(
                "/jobs/schedules?group=g", json={"schedules": [item]}, headers=ADMIN
            )
            assert refused.status_code == 422 and len(refused.text) < 1_000, refused.text[:300]
            assert "schedules[0]" in refused.json()["detail"]
        assert (await client.get("/jobs/schedules")).json() == []
