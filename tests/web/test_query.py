"""The query of every route of both routers, checked in one place: a parameter
given twice is a 422 that says so, as is one the route does not take; the
parameters the app's own dependencies read are the route's too."""

from __future__ import annotations

from typing import Annotated

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException, Query
from pydantic import BaseModel

from fastapi_jobs import Scheduler

from ..conftest import serve, virtual_scheduler

pytestmark = pytest.mark.looptime

KEY = {"key": "secret"}


async def require_key(key: Annotated[str | None, Query()] = None) -> None:
    """An app's auth that reads the query (an API key as ``?key=``)."""
    if key != "secret":
        raise HTTPException(401, "send ?key=")


def make_app() -> FastAPI:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def beat() -> None: ...

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router, dependencies=[Depends(require_key)])
    app.include_router(scheduler.control_router(dependencies=[Depends(require_key)]))
    return app


# Every route of the two routers: its method, a path, its template, and what it takes.
ROUTES = [
    ("GET", "/jobs", "/jobs", "cursor, key, limit, q, state"),
    ("GET", "/jobs/instances", "/jobs/instances", "key"),
    ("GET", "/jobs/schedules", "/jobs/schedules", "cursor, key, limit, q, state"),
    ("GET", "/jobs/beat", "/jobs/{name}", "key"),
    ("GET", "/jobs/beat/runs", "/jobs/{name}/runs", "cursor, key, limit"),
    ("GET", "/jobs/ui", "/jobs/ui", "cursor, job, key, limit, notice, q, state"),
    ("GET", "/jobs/ui/ui.css", "/jobs/ui/{file}", "key, v"),
    ("POST", "/jobs/beat/run", "/jobs/{name}/run", "key, timeout, wait"),
    ("POST", "/jobs/beat/pause", "/jobs/{name}/pause", "key, until"),
    ("POST", "/jobs/beat/resume", "/jobs/{name}/resume", "key"),
    ("POST", "/jobs/beat/backfill", "/jobs/{name}/backfill", "key"),
    ("POST", "/jobs/schedules", "/jobs/schedules", "key"),
    ("PUT", "/jobs/schedules", "/jobs/schedules", "group, key"),
    ("PATCH", "/jobs/schedules/s", "/jobs/schedules/{name}", "key"),
    ("DELETE", "/jobs/schedules/s", "/jobs/schedules/{name}", "key"),
]


async def test_a_route_refuses_a_parameter_it_does_not_take() -> None:
    """Each route answers a parameter it does not take with a 422 naming the
    parameter and the route, and listing what it takes: before, the runs of a
    job answered ?state=failing with every run, as though filtered. The app's
    auth comes first (401)."""
    async with serve(make_app()) as client:
        for method, path, template, takes in ROUTES:
            answer = await client.request(method, path, params={**KEY, "nope": "1"})
            assert answer.status_code == 422, (method, path, answer.text)
            assert answer.json() == {
                "detail": f"'nope': {method} {template} takes no such query parameter "
                f"(it takes {takes}): leave it out"
            }
            unknown = await client.request(method, path, params={"nope": "1"})
            assert unknown.status_code == 401, (method, path, unknown.text)
        for ignored in ("state", "q"):
            runs = await client.get("/jobs/beat/runs", params={**KEY, ignored: "failing"})
            assert runs.status_code == 422
            assert runs.json()["detail"].startswith(f"'{ignored}': GET /jobs/{{name}}/runs takes")
        hostile = await client.get("/jobs", params={**KEY, "<b>" + "x" * 5000: "1"})
        assert hostile.status_code == 422 and "x" * 100 not in hostile.text


@pytest.mark.parametrize(
    ("method", "path", "given"),
    [
        ("GET", "/jobs", "limit=5&limit=500"),
        ("GET", "/jobs", "q=a&q=b"),
        ("GET", "/jobs/schedules", "state=paused&state=failing"),
        ("GET", "/jobs/beat/runs", "cursor=a&cursor=b"),
        ("GET", "/jobs/ui", "q=a&state=paused&q=b"),
        ("GET", "/jobs/ui/ui.css", "v=1&v=1"),
        ("GET", "/jobs/instances", "key=secret&key=secret"),
        ("POST", "/jobs/beat/run", "wait=true&wait=false"),
        ("POST", "/jobs/beat/pause", "until=2030-01-01T00:00:00Z&until=2031-01-01T00:00:00Z"),
        ("PUT", "/jobs/schedules", "group=a&group=b"),
    ],
)
async def test_a_parameter_given_twice_is_a_422_that_says_so(
    method: str, path: str, given: str
) -> None:
    """A parameter given more than once is refused on every route, whichever
    value FastAPI would have read (the last of ?group=a&group=b, the first of
    ?limit=5&limit=500): nothing is done with one of them."""
    name = given.partition("=")[0]
    times = given.count(f"{name}=")
    query = given if name == "key" else f"key=secret&{given}"
    async with serve(make_app()) as client:
        answer = await client.request(method, f"{path}?{query}")
        paused = (await client.get("/jobs/beat", params=KEY)).json()["paused"]
    assert answer.status_code == 422, answer.text
    assert answer.json() == {"detail": f"'{name}': give it once; it came {times} times"}
    assert paused is False  # the pause was not made


class Signed(BaseModel):
    """An app's query parameters as a model (FastAPI's query parameter models)."""

    signature: str = ""
    expires: int = 0
    scopes: list[str] = []


async def test_an_apps_query_model_and_lists_are_taken() -> None:
    """An app's dependency that reads its query as a model takes each field;
    a parameter that takes a list (the app's) may be given several times."""

    async def signed(
        query: Annotated[Signed, Query()], tag: Annotated[list[str] | None, Query()] = None
    ) -> None: ...

    scheduler = virtual_scheduler()
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router, dependencies=[Depends(signed)])
    async with serve(app) as client:
        taken = await client.get("/jobs?signature=abc&expires=9&scopes=a&scopes=b&tag=x&tag=y")
        refused = await client.get("/jobs", params={"signature": "abc", "sig": "9"})
        twice = await client.get("/jobs?signature=a&signature=b")
    assert taken.status_code == 200, taken.text
    assert refused.status_code == 422
    assert (
        "(it takes cursor, expires, limit, q, scopes, signature, state, tag)"
        in (refused.json()["detail"])
    )
    assert twice.json() == {"detail": "'signature': give it once; it came 2 times"}


async def test_an_empty_page_parameter_is_as_if_it_were_not_given() -> None:
    """`?limit=`, `?state=`, `?cursor=` and `?q=`, as a browser's form sends a
    field left blank: the listing answers as without them."""
    scheduler = Scheduler()

    @scheduler.every(hours=1)
    async def job() -> None: ...

    app = FastAPI()
    app.include_router(scheduler.router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        plain = (await client.get("/jobs")).json()
        for blank in ("limit=", "state=", "cursor=", "q=", "limit=&q=&state="):
            answer = await client.get(f"/jobs?{blank}")
            assert answer.status_code == 200 and answer.json() == plain, blank
