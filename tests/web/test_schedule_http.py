"""Schedules made at run time over HTTP: GET /jobs/schedules on the status
router, POST/PATCH/DELETE on the control router (its auth, its same-origin
rule), what hostile input gets (one 422 with a message, never a 500), and a
store that is down or does not answer (503, saying whether anything changed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
import sqlalchemy as sa
from fastapi import Depends, FastAPI
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import START, serve, virtual_scheduler
from ..core.test_operate import ADMIN, require_admin
from ..support.postgres import PostgresServer

REPORT = {
    "name": "acme-report",
    "task": "report",
    "schedule": {"every": 10},
    "kwargs": {"tenant": "acme"},
}


def make_app(scheduler: Scheduler) -> FastAPI:
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    app.include_router(scheduler.control_router(dependencies=[Depends(require_admin)]))
    return app


def with_report(ran: list[tuple[str, float]], **kwargs: Any) -> Scheduler:
    scheduler = virtual_scheduler(**kwargs) if "store" not in kwargs else Scheduler(**kwargs)

    @scheduler.task()
    async def report(ctx: JobContext, tenant: str, hour: int = 7) -> None:
        ran.append((tenant, ctx.tick.timestamp() - START.timestamp()))

    @scheduler.every(hours=1)
    async def declared() -> None: ...

    return scheduler


# -- on virtual time, without a store ---------------------------------------------


@pytest.mark.looptime
async def test_a_schedule_made_changed_and_removed_over_http_runs_as_said() -> None:
    """POST makes it (201, and it runs with its arguments, a job among the jobs),
    GET /jobs/schedules lists it (not taken for a job named 'schedules'), PATCH
    changes what it is given (200), DELETE removes it (204: no more runs)."""
    ran: list[tuple[str, float]] = []
    async with serve(make_app(with_report(ran))) as client:
        made = await client.post("/jobs/schedules", json=REPORT, headers=ADMIN)
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["schedule"] == {"every": 10.0, "offset": 0.0}
        assert (body["name"], body["task"], body["kwargs"], body["known"]) == (
            "acme-report",
            "report",
            {"tenant": "acme"},
            True,
        )
        assert body["describe"] == "every 10s" and body["options"] == {}
        await anyio.sleep(25)  # runs at 10 and 20
        listed = await client.get("/jobs/schedules")
        assert listed.status_code == 200
        assert listed.json() == [{**body, "version": listed.json()[0]["version"]}]
        job = (await client.get("/jobs/acme-report")).json()
        assert (job["task"], job["runs"]) == ("report", 2)

        changed = await client.patch(
            "/jobs/schedules/acme-report",
            json={"kwargs": {"tenant": "zeta"}, "options": {"retries": 1}},
            headers=ADMIN,
        )
        assert changed.status_code == 200, changed.text
        assert changed.json()["kwargs"] == {"tenant": "zeta"}
        assert changed.json()["options"] == {"retries": 1}
        assert changed.json()["schedule"] == body["schedule"]  # kept
        assert changed.json()["version"] > body["version"]
        await anyio.sleep(10)  # runs at 30

        cron = await client.patch(
            "/jobs/schedules/acme-report",
            json={"schedule": {"cron": "0 7 * * *", "tz": "Europe/Lisbon"}},
            headers=ADMIN,
        )
        assert cron.json()["schedule"] == {"cron": "0 7 * * *", "tz": "Europe/Lisbon"}
        gone = await client.delete("/jobs/schedules/acme-report", headers=ADMIN)
        assert (gone.status_code, gone.content) == (204, b"")
        await anyio.sleep(86400)
        assert (await client.get("/jobs/schedules")).json() == []
        assert (await client.get("/jobs/acme-report")).status_code == 404
    assert ran == [("acme", 10.0), ("acme", 20.0), ("zeta", 30.0)]


@pytest.mark.looptime
async def test_a_taken_name_is_409_and_an_unknown_one_404() -> None:
    async with serve(make_app(with_report([]))) as client:
        assert (await client.post("/jobs/schedules", json=REPORT, headers=ADMIN)).status_code == 201
        again = await client.post("/jobs/schedules", json=REPORT, headers=ADMIN)
        assert again.status_code == 409
        assert again.json() == {
            "detail": "a schedule named 'acme-report' exists: change it instead"
        }
        for method in ("PATCH", "DELETE"):
            unknown = await client.request(
                method, "/jobs/schedules/nope", json={"kwargs": {}}, headers=ADMIN
            )
            assert unknown.status_code == 404
            assert unknown.json() == {
                "detail": "no schedule named 'nope'; the schedules are: 'acme-report'"
            }


@pytest.mark.looptime
async def test_changes_take_the_apps_auth_and_refuse_other_sites() -> None:
    """The control router's rules hold for schedules: the app's auth (401), and
    no cross-origin browser request (403, CSRF); the list is a status read."""
    async with serve(make_app(with_report([]))) as client:
        for method, path in (
            ("POST", "/jobs/schedules"),
            ("PATCH", "/jobs/schedules/acme-report"),
            ("DELETE", "/jobs/schedules/acme-report"),
        ):
            assert (await client.request(method, path, json=REPORT)).status_code == 401
            elsewhere = {**ADMIN, "sec-fetch-site": "cross-site"}
            refused = await client.request(method, path, json=REPORT, headers=elsewhere)
            assert refused.status_code == 403
            assert "cross-origin request refused" in refused.json()["detail"]
        assert (await client.get("/jobs/schedules")).json() == []  # nothing made


@pytest.mark.looptime
@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        'application/json; charset="UTF-16"',
    ],
)
async def test_a_body_that_does_not_say_it_is_json_is_415(content_type: str | None) -> None:
    """A page elsewhere can post text/plain, a form or multipart with no
    preflight, never JSON: a body of JSON sent so is refused (415), nothing
    made; application/json (with charset utf-8, or none) and +json types are
    JSON. JSON is UTF-8: a body said to be in another charset is refused too,
    not read as UTF-8 (where it would fail as "not JSON", or arrive changed)."""
    headers = dict(ADMIN)
    if content_type is not None:
        headers["content-type"] = content_type
    body = json.dumps(REPORT).encode()
    async with serve(make_app(with_report([]))) as client:
        refused = await client.post("/jobs/schedules", content=body, headers=headers)
        backfill = await client.post(
            "/jobs/acme-report/backfill",
            content=b'{"since": "2026-03-01T00:00:00Z", "until": "2026-03-01T01:00:00Z"}',
            headers=headers,
        )
        assert (await client.get("/jobs/schedules")).json() == []
        # A quoted parameter may hold a ";": it names no charset.
        fine = {**ADMIN, "content-type": 'application/json; x="a;charset=utf-16"; charset=utf-8'}
        made = await client.post("/jobs/schedules", content=body, headers=fine)
        suffixed = {**ADMIN, "content-type": "application/merge-patch+json"}
        patched = await client.patch(
            "/jobs/schedules/acme-report", content=b'{"kwargs": {"tenant": "b"}}', headers=suffixed
        )
    for answer in (refused, backfill):
        assert answer.status_code == 415, answer.text
        said = answer.json()["detail"]
        assert "Content-Type: application/json" in said or "JSON in UTF-8" in said
    assert made.status_code == 201 and patched.status_code == 200, (made.text, patched.text)


# Each route that reads a JSON body, and a body it takes (in UTF-8).
BODIES = [
    ("POST", "/jobs/schedules", {**REPORT, "name": "other-report", "kwargs": {"tenant": "é"}}),
    ("PUT", "/jobs/schedules?group=reports", {"schedules": [{**REPORT, "name": "in-set"}]}),
    ("PATCH", "/jobs/schedules/acme-report", {"kwargs": {"tenant": "zéta"}}),
    ("POST", "/jobs/declared/backfill", {"since": "2026-03-01T00:00Z", "until": "2026-03-01T01Z"}),
]


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("encoding", "said"),
    [
        ("utf-16", "UTF-16 with a byte order mark"),
        ("utf-16-le", "UTF-16 or UTF-32"),
        ("utf-16-be", "UTF-16 or UTF-32"),
        ("utf-32", "UTF-32 with a byte order mark"),
        ("utf-32-be", "UTF-16 or UTF-32"),
        ("utf-8-sig", "UTF-8 with a byte order mark"),
        ("latin-1", "not UTF-8 from byte "),
    ],
)
async def test_a_body_not_in_utf8_is_415_on_every_route_that_reads_one(
    encoding: str, said: str
) -> None:
    """JSON on the wire is UTF-8 with no byte order mark (RFC 8259), as the
    reference says: a body in UTF-16 or UTF-32 (with a mark or without), UTF-8
    behind a mark, or bytes that are not UTF-8, is a 415 that says what it is,
    on each route that reads a body; nothing changes. The same bodies in UTF-8
    are taken."""
    headers = {**ADMIN, "content-type": "application/json"}
    async with serve(make_app(with_report([]))) as client:
        made = await client.post("/jobs/schedules", json=REPORT, headers=ADMIN)
        assert made.status_code == 201, made.text
        for method, url, body in BODIES:
            text = json.dumps(body, ensure_ascii=False)
            if encoding == "latin-1" and text.isascii():
                continue  # the same bytes as UTF-8
            sent = text.encode(encoding)
            answer = await client.request(method, url, content=sent, headers=headers)
            assert answer.status_code == 415, (method, url, answer.text)
            assert answer.json()["detail"].startswith(
                f"send the body as JSON in UTF-8, with no byte order mark: it is {said}"
            )
        assert (await client.get("/jobs/schedules")).json() == [made.json()]
        assert (await client.get("/jobs/declared/runs")).json() == []
        for method, url, body in BODIES:
            taken = await client.request(method, url, json=body, headers=ADMIN)
            assert taken.status_code in (200, 201, 202), (method, url, taken.text)


@pytest.mark.looptime
async def test_values_under_names_like_secrets_are_hidden_in_the_listing() -> None:
    """A schedule's kwargs are status anyone who reads /jobs sees: a value under a
    name like a secret's, at any depth, is listed as "[hidden]" (the task still
    gets it), as a database error's quoted values are on the status page."""
    got: list[dict[str, Any]] = []
    scheduler = virtual_scheduler()

    @scheduler.task()
    async def sync(**kwargs: Any) -> None:
        got.append(kwargs)

    secrets = {
        "user": "ana",
        "password": "hunter2",
        "source": {"api_key": "k-123", "url": "https://example.com", "Auth_Token": "t"},
        "hooks": [{"client_secret": "s"}],
        "pwd": "p",
        "session": "x",
        "webhook_url": "https://hooks.example/T0/B1",
        "source_url": "postgresql://app:hunter3@db/app",
    }
    body = {"name": "s", "task": "sync", "schedule": {"every": 3600}, "kwargs": secrets}
    async with serve(make_app(scheduler)) as client:
        made = await client.post("/jobs/schedules", json=body, headers=ADMIN)
        listed = (await client.get("/jobs/schedules")).json()
        await scheduler.run_now("s")
    hidden = {
        "user": "ana",
        "password": "[hidden]",
        "source": {"api_key": "[hidden]", "url": "https://example.com", "Auth_Token": "[hidden]"},
        "hooks": [{"client_secret": "[hidden]"}],
        "pwd": "[hidden]",
        "session": "[hidden]",
        "webhook_url": "[hidden]",
        "source_url": "postgresql://[hidden]@db/app",  # a URL's credentials, whatever its name
    }
    assert made.status_code == 201 and made.json()["kwargs"] == hidden
    assert [s["kwargs"] for s in listed] == [hidden]
    assert "hunter2" not in json.dumps(listed) and "hunter3" not in json.dumps(listed)
    assert got == [secrets]  # the task gets what was given


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("method", "body", "said"),
    [
        ("POST", {**REPORT, "schedule": {"every": 0.001}}, "runs 0.001s apart"),
        ("POST", {**REPORT, "schedule": {"cron": "* * * * * *"}}, "runs 1s apart"),
        ("POST", {**REPORT, "options": {"catch_up": 1e300}}, "catch_up=1e+300s is longer"),
        ("POST", {**REPORT, "options": {"timeout": 8 * 86400}}, "timeout=691200s is longer"),
        ("POST", {**REPORT, "options": {"retries": 1000}}, "retries=1000 is more than the 10"),
        ("PATCH", {"schedule": {"every": 1}}, "runs 1s apart"),
        ("PATCH", {"options": {"jitter": 1e9}}, "jitter=1e+09s is longer"),
    ],
)
async def test_a_schedule_past_the_bounds_of_a_web_form_is_422(
    method: str, body: dict[str, Any], said: str
) -> None:
    """Over HTTP a schedule's ticks are at least 10 s apart, its durations at most
    a week and its retries at most 10 (ScheduleBounds' defaults): past one is a
    422 that names the bound and the setting, and nothing changes."""
    async with serve(make_app(with_report([]))) as client:
        await client.post("/jobs/schedules", json={**REPORT, "name": "kept"}, headers=ADMIN)
        path = "/jobs/schedules" if method == "POST" else "/jobs/schedules/kept"
        answer = await client.request(method, path, json=body, headers=ADMIN)
        listed = (await client.get("/jobs/schedules")).json()
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert said in detail and "ScheduleBounds(" in detail, detail
    assert [(s["name"], s["schedule"]) for s in listed] == [
        ("kept", {"every": 10.0, "offset": 0.0})
    ]


@pytest.mark.looptime
async def test_the_bounds_are_the_apps_to_set() -> None:
    """An app that lets its operators ask for a tick every second, and a timeout
    of a month, says so with control_router(bounds=...); code is not bound."""
    from datetime import timedelta

    from fastapi_jobs import ConfigurationError, Every, ScheduleBounds

    scheduler = with_report([])
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    bounds = ScheduleBounds(shortest=1, longest=timedelta(days=31))
    app.include_router(
        scheduler.control_router(dependencies=[Depends(require_admin)], bounds=bounds)
    )
    body = {**REPORT, "schedule": {"every": 1}, "options": {"timeout": 30 * 86400}}
    async with serve(app) as client:
        made = await client.post("/jobs/schedules", json=body, headers=ADMIN)
        await scheduler.add_schedule("fast", "report", Every(seconds=0.5), kwargs={"tenant": "a"})
    assert made.status_code == 201, made.text
    with pytest.raises(ConfigurationError, match="shortest=-1"):
        ScheduleBounds(shortest=-1)
    with pytest.raises(ConfigurationError, match="pass a ScheduleBounds"):
        scheduler.control_router(public=True, bounds={"shortest": 1})  # type: ignore[arg-type]


NESTED = "[" * 20_000 + "]" * 20_000


@pytest.mark.parametrize(
    ("method", "body", "said"),
    [
        ("POST", b"", "the body is not JSON"),
        ("POST", b"{nope", "the body is not JSON"),
        ("POST", NESTED.encode(), "the body is not JSON"),
        ("POST", b"[1, 2]", "the body is not a JSON object"),
        ("POST", b'{"x": ' + b"1" * 80_000 + b"}", "the body takes more than"),
        ("POST", {**REPORT, "kwargs": ["tenant"]}, "kwargs: Input should be a valid dictionary"),
        ("POST", {**REPORT, "kwargs": {"tenant": "x" * 66_000}}, "the most is 65536"),
        ("POST", {**REPORT, "kwargs": {"colour": 1}}, "takes no argument 'colour'"),
        ("POST", {**REPORT, "kwargs": {"tenant": [[[[[[[[[[[[1]]]]]]]]]]]]}}, None),
        ("POST", {**REPORT, "name": 5}, "name: Input should be a valid string"),
        ("POST", {**REPORT, "colour": 1}, "colour: Extra inputs are not permitted"),
        ("POST", {**REPORT, "x" * 5000: 1}, "… (5000 characters)"),
        ("POST", {**REPORT, "task": "nope"}, "no task named 'nope'"),
        ("POST", {**REPORT, "name": "a/b"}, "no '/'"),
        ("POST", {**REPORT, "name": "bad\x00name"}, r"holds '\x00'"),
        ("POST", {**REPORT, "name": "x" * 201}, "1 to 200"),
        ("POST", {**REPORT, "name": "declared"}, "a declared job has that name"),
        ("POST", {**REPORT, "name": "schedules"}, "the route GET /jobs/schedules has that name"),
        ("POST", {**REPORT, "name": "ui"}, "the route GET /jobs/ui has that name"),
        ("POST", {**REPORT, "kwargs": {"tenant": "\ud800"}}, "a lone surrogate"),
        ("POST", {**REPORT, "kwargs": {"tenant": ["ok", {"\udfff": 1}]}}, "a lone surrogate"),
        ("PATCH", {"kwargs": {"tenant": "a\ud800b"}}, "a lone surrogate"),
        ("POST", {**REPORT, "schedule": {"cron": "0 7 * * mom"}}, "invalid cron expression"),
        ("POST", {**REPORT, "schedule": {"cron": "@daily", "tz": "Mars/X"}}, "unknown timezone"),
        ("POST", {**REPORT, "schedule": {"cron": "@daily", "tz": 5}}, "tz= takes an IANA name"),
        ("POST", {**REPORT, "schedule": {"cron": 5}}, "a cron expression is a string"),
        ("POST", {**REPORT, "schedule": {"every": "soon"}}, "not a duration"),
        ("POST", {**REPORT, "schedule": {"every": -1}}, "must be >= 0 seconds"),
        ("POST", {**REPORT, "schedule": {"every": 1e400}}, "finite"),
        ("POST", {**REPORT, "schedule": {"hourly": True}}, "write {'every': seconds"),
        ("POST", {**REPORT, "schedule": "hourly"}, "schedule: Input should be a valid dict"),
        ("POST", {**REPORT, "options": {"enqueue": 1}}, "not an option of a stored schedule"),
        ("POST", {**REPORT, "options": {"retries": "3"}}, "retries='3': pass a whole number"),
        ("POST", {**REPORT, "options": {"timeout": -1}}, "timeout=-1"),
        ("POST", {**REPORT, "options": {"paused": "yes"}}, "paused"),
        # Without a store, nothing remembers the last tick (it was an AssertionError
        # in the job's task at its first tick, which stopped the app).
        ("POST", {**REPORT, "options": {"catch_up": 60}}, "catch_up= needs the store"),
        ("PATCH", {}, "give at least one of task, schedule, kwargs, options"),
        ("PATCH", {"kwargs": None, "options": {}}, "give at least one of"),
        ("PATCH", {"name": "renamed"}, "name: Extra inputs are not permitted"),
        ("PATCH", {"schedule": {"every": 0}}, "longer than zero"),
        ("PATCH", {"kwargs": {"tenant": 1, "extra": 2}}, "takes no argument 'extra'"),
        ("PATCH", {"task": 7}, "task: Input should be a valid string"),
    ],
)
@pytest.mark.looptime
async def test_hostile_input_is_one_422_that_says_what_is_wrong(
    method: str, body: bytes | dict[str, Any], said: str | None
) -> None:
    """Each mistake is a 422 whose detail is one string saying it (never a 500,
    never what was sent echoed whole), and nothing is made or changed."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with serve(make_app(with_report([]))) as client:
        await client.post("/jobs/schedules", json={**REPORT, "name": "kept"}, headers=ADMIN)
        path = "/jobs/schedules" if method == "POST" else "/jobs/schedules/kept"
        headers = {**ADMIN, "content-type": "application/json"}
        answer = await client.request(method, path, content=content, headers=headers)
        listed = (await client.get("/jobs/schedules")).json()
    if said is None:  # deep but fine JSON: made
        assert answer.status_code == 201, answer.text
        return
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and said in detail
    assert len(detail) < 600
    assert [(s["name"], s["kwargs"]) for s in listed] == [("kept", {"tenant": "acme"})]


@pytest.mark.looptime
async def test_a_name_in_the_path_that_no_schedule_can_have_is_422() -> None:
    async with serve(make_app(with_report([]))) as client:
        for method in ("PATCH", "DELETE"):
            answer = await client.request(
                method, "/jobs/schedules/a%00b", json={"kwargs": {}}, headers=ADMIN
            )
            assert answer.status_code == 422
            assert r"holds '\x00'" in answer.json()["detail"]


@pytest.mark.looptime
async def test_openapi_documents_the_schedule_models_and_bodies() -> None:
    async with serve(make_app(with_report([]))) as client:
        spec = (await client.get("/openapi.json")).json()
    listed = spec["paths"]["/jobs/schedules"]["get"]["responses"]["200"]
    assert listed["content"]["application/json"]["schema"]["items"] == {
        "$ref": "#/components/schemas/ScheduleInfo"
    }
    made = spec["paths"]["/jobs/schedules"]["post"]
    body = made["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["name", "task", "schedule"]
    assert set(made["responses"]) == {"201", "409", "422", "503"}
    assert set(spec["paths"]["/jobs/schedules/{name}"]) == {"patch", "delete"}
    assert "known" in spec["components"]["schemas"]["ScheduleInfo"]["required"]


# -- with a store: PostgreSQL down, or not answering -------------------------------


@asynccontextmanager
async def store_app(url: str, store_timeout: float) -> AsyncIterator[httpx.AsyncClient]:
    scheduler = with_report([], store=SQLAlchemyStore(url, timeout=store_timeout))
    async with serve(make_app(scheduler)) as client:
        yield client


async def test_a_store_that_is_down_is_503_saying_nothing_changed(
    postgres: PostgresServer,
) -> None:
    """The list says why it cannot be read, and a change that nothing changed;
    neither shows the database's URL nor its password."""
    url = postgres.url("no_such_database").replace("postgres@", "postgres:hunter2@")
    async with store_app(url, store_timeout=0.5) as client:
        listed = await client.get("/jobs/schedules")
        made = await client.post("/jobs/schedules", json=REPORT, headers=ADMIN)
        changed = await client.patch(
            "/jobs/schedules/acme-report", json={"kwargs": {}}, headers=ADMIN
        )
        removed = await client.delete("/jobs/schedules/acme-report", headers=ADMIN)
    assert listed.status_code == 503
    assert listed.json()["detail"].startswith("cannot read the schedules: ")
    assert made.status_code == 503
    assert "cannot create schedule 'acme-report'" in made.json()["detail"]
    assert "nothing changed" in made.json()["detail"]
    assert changed.status_code == 503 and "nothing changed" in changed.json()["detail"]
    assert removed.status_code == 503 and "nothing changed" in removed.json()["detail"]
    for answer in (listed, made, changed, removed):
        detail = answer.json()["detail"]
        assert "hunter2" not in detail and "postgresql" not in detail and "Traceback" not in detail


async def test_a_change_the_store_does_not_confirm_is_503_saying_it_may_be_made(
    postgres: PostgresServer,
) -> None:
    """The schedules table locked by another session: the write waits past its
    deadline, and the answer says it may have been made (not "nothing changed")
    and where to look; the list, once the lock is gone, shows what is."""
    url = postgres.url(postgres.create_database())
    async with store_app(url, store_timeout=0.3) as client:
        warm = await client.post("/jobs/schedules", json={**REPORT, "name": "warm"}, headers=ADMIN)
        assert warm.status_code == 201, warm.text
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                await conn.execute(sa.text("BEGIN"))
                await conn.execute(
                    sa.text("LOCK TABLE fastapi_jobs_schedules IN ACCESS EXCLUSIVE MODE")
                )
                made = await client.post("/jobs/schedules", json=REPORT, headers=ADMIN)
                await conn.execute(sa.text("ROLLBACK"))
        finally:
            await engine.dispose()
        listed = await client.get("/jobs/schedules")
    assert made.status_code == 503
    detail = made.json()["detail"]
    assert "did not confirm the create of schedule 'acme-report' in time" in detail
    assert "it may have been made; GET /jobs/schedules shows whether it was" in detail
    assert "nothing changed" not in detail
    assert listed.status_code == 200
    assert "warm" in [s["name"] for s in listed.json()]
