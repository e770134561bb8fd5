"""The listings a page at a time (``GET /jobs``, ``/jobs/schedules``,
``/jobs/{name}/runs``, the status page) over 5,000 schedules in a real SQLite
file: every row on exactly one page while rows come and go, the filters and
their counts, whole listings, and bad values refused without being echoed."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from fastapi_jobs import Every, Scheduler
from fastapi_jobs.stores import Ended, SQLAlchemyStore

from ..conftest import HOUR, claim1, serve, virtual_scheduler
from ..stores.test_store import opened
from ..support.cluster import ROOT
from ..support.waiting import poll
from .many import LEGACY, PAUSED, RARE, TENANTS, legacy, seed, tenant

HTML = {"Accept": "text/html"}
JOBS = TENANTS + 2  # the stored schedules run here, and two declared jobs
NEXT = re.compile(r'^<([^>]+)>; rel="next"$')


def next_page(answer: httpx.Response) -> str | None:
    link = answer.headers.get("link")
    if link is None:
        return None
    found = NEXT.match(link)
    assert found is not None, link
    return found.group(1)


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[tuple[Scheduler, httpx.AsyncClient]]:
    """An app on a store that holds the 5,000 schedules, with a job failing and
    one running; its client once both are so."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'many.sqlite3'}"
    await seed(url)
    scheduler = Scheduler(store=SQLAlchemyStore(url), shutdown_timeout=1)

    @scheduler.task()
    async def report(tenant: str) -> None: ...

    @scheduler.every(hours=RARE, run_on_startup=True)
    async def broken() -> None:
        raise ConnectionError("smtp refused")

    @scheduler.every(hours=RARE, run_on_startup=True)
    async def slow() -> None:
        await anyio.sleep(3600)

    made = FastAPI(lifespan=scheduler.lifespan)
    made.include_router(scheduler.router)
    async with serve(made) as client:

        async def failed() -> bool:
            return bool((await client.get("/jobs/broken")).json()["last_outcome"] == "failed")

        await poll(failed, within=30)
        yield scheduler, client


async def walk(client: httpx.AsyncClient, url: str, between: Any = None) -> list[list[str]]:
    """The names of each page, from ``url`` on by the Link header; ``between``
    (a coroutine function) is awaited after each page but the last."""
    pages = []
    while url is not None:
        answer = await client.get(url)
        assert answer.status_code == 200, answer.text
        pages.append([row["name"] for row in answer.json()])
        nxt = next_page(answer)
        if nxt is not None and between is not None:
            await between()
        url = nxt  # type: ignore[assignment]
    return pages


async def test_every_job_is_on_exactly_one_page_while_schedules_come_and_go(
    app: tuple[Scheduler, httpx.AsyncClient],
) -> None:
    """Pages follow one another by name: a schedule made behind the cursor
    shifts no row onto the next page, one made ahead of it is met there, and
    one removed ahead is not; the body is a plain list."""
    scheduler, client = app
    first = await client.get("/jobs", params={"limit": 1000})
    assert first.headers["x-total-count"] == str(JOBS)
    made = iter(range(10))

    async def change() -> None:
        n = next(made)
        for name in (f"aaa-{n}", f"zzz-{n}"):  # one behind the cursor, one ahead
            await scheduler.add_schedule(name, "report", Every(hours=RARE), kwargs={"tenant": name})
        await scheduler.remove_schedule(tenant(TENANTS - 1 - n))  # ahead

    pages = await walk(client, "/jobs?limit=1000", change)
    names = [name for page in pages for name in page]
    assert len(pages) == 5 and [len(p) for p in pages[:4]] == [1000] * 4
    assert names == sorted(names) and len(set(names)) == len(names)
    assert not any(name.startswith("aaa-") for name in names)  # made behind
    assert [n for n in names if n.startswith("zzz-")] == [f"zzz-{n}" for n in range(4)]
    assert tenant(TENANTS - 1) not in names  # removed before its page came
    assert {tenant(i) for i in range(TENANTS - 4)} <= set(names)


async def test_filters_say_how_many_match_and_page_them(
    app: tuple[Scheduler, httpx.AsyncClient],
) -> None:
    """state= and q= narrow each listing, X-Total-Count counts what they keep,
    and the Link header keeps them."""
    _, client = app

    async def listed(url: str, **params: str) -> tuple[list[str], str, str | None]:
        answer = await client.get(url, params=params)
        assert answer.status_code == 200, answer.text
        names = [row["name"] for row in answer.json()]
        return names, answer.headers["x-total-count"], next_page(answer)

    paused, total, nxt = await listed("/jobs", state="paused", limit="60")
    assert (paused, total) == ([tenant(i) for i in range(60)], str(PAUSED))
    assert nxt is not None and "state=paused" in nxt
    rest = (await client.get(nxt)).json()
    assert [row["name"] for row in rest] == [tenant(i) for i in range(60, PAUSED)]
    assert all(row["paused"] for row in rest)
    assert (await listed("/jobs", state="failing"))[:2] == (["broken"], "1")
    assert (await listed("/jobs", state="running"))[:2] == (["slow"], "1")
    found, total, nxt = await listed("/jobs", q="TENANT-0479")
    assert (found, total, nxt) == ([tenant(i) for i in range(4790, 4800)], "10", None)
    assert (await listed("/jobs", q="tenant-0009", state="paused"))[1] == "10"

    every, total, nxt = await listed("/jobs/schedules")
    assert (len(every), total) == (100, str(TENANTS + LEGACY)) and nxt is not None
    alone, total, nxt = await listed("/jobs/schedules", state="left_alone", limit="all")
    assert (alone, total, nxt) == ([legacy(i) for i in range(LEGACY)], str(LEGACY), None)
    found, total, nxt = await listed("/jobs/schedules", q="legacy-01", limit="50")
    assert (found, total) == ([legacy(i) for i in range(100, 150)], "100")
    assert nxt is not None
    assert [row["name"] for row in (await client.get(nxt)).json()] == [
        legacy(i) for i in range(150, 200)
    ]
    assert (await listed("/jobs/schedules", state="paused"))[1] == str(PAUSED)

    wrong = await client.get("/jobs", params={"state": "left_alone"})
    assert wrong.status_code == 422 and "GET /jobs/schedules?state=left_alone" in wrong.text


async def test_a_script_can_ask_for_every_row_at_once(
    app: tuple[Scheduler, httpx.AsyncClient],
) -> None:
    """limit=all: every row in one answer, with no next page; by default a page
    of 100."""
    _, client = app
    whole = await client.get("/jobs", params={"limit": "all"})
    assert len(whole.json()) == JOBS and "link" not in whole.headers
    assert whole.headers["x-total-count"] == str(JOBS)
    default = await client.get("/jobs")
    assert len(default.json()) == 100 and next_page(default) is not None
    schedules = await client.get("/jobs/schedules", params={"limit": "all"})
    assert len(schedules.json()) == TENANTS + LEGACY and "link" not in schedules.headers


async def test_the_page_pages_searches_and_filters_by_state(
    app: tuple[Scheduler, httpx.AsyncClient],
) -> None:
    """The status page shows 200 rows of those the filters keep, says how many
    match, and links to the next page and back to the first."""
    _, client = app
    page = (await client.get("/jobs/ui", headers=HTML)).text
    rows = re.findall(r'<tr class="job [^"]*" data-job="([^"]*)"', page)
    assert rows == ["broken", "slow", *(tenant(i) for i in range(198))]
    assert f"showing 200 of {JOBS}" in page and "First page" not in page
    after = re.search(r'<a href="([^"]+)" rel="next">Next page</a>', page)
    assert after is not None
    second = (await client.get(after.group(1).replace("&amp;", "&"), headers=HTML)).text
    rows = re.findall(r'<tr class="job [^"]*" data-job="([^"]*)"', second)
    assert rows == [tenant(i) for i in range(198, 398)]
    assert 'rel="first">First page</a>' in second

    paused = (await client.get("/jobs/ui", params={"state": "paused", "q": "-0005"})).text
    assert re.findall(r'data-job="([^"]*)"', paused) == [tenant(i) for i in range(50, 60)]
    assert "10 match" in paused and '<option value="paused" selected>' in paused
    alone = (await client.get("/jobs/ui", params={"state": "left_alone", "q": "legacy-019"})).text
    assert "data-job=" not in alone
    assert "Schedules this instance cannot run (10)" in alone


RUNS_OF_MANY_DIGITS = base64.urlsafe_b64encode(("runs:" + "9" * 5_000).encode()).decode()


@pytest.mark.parametrize(
    ("url", "params", "said"),
    [
        ("/jobs", {"limit": "0"}, "limit: write a whole number from 1 to 1000"),
        ("/jobs", {"limit": "1001"}, "limit:"),
        ("/jobs", {"limit": "<b>12</b>"}, "limit=all for every row"),
        ("/jobs", {"cursor": "<b>not-one</b>"}, "cursor: give the cursor of this listing"),
        ("/jobs", {"state": "<b>broken</b>"}, "state: write one of failing, paused, running"),
        ("/jobs", {"q": "<b>" + "x" * 200}, "q: write at most 200 characters"),
        ("/jobs/schedules", {"limit": "-1"}, "limit:"),
        ("/jobs/schedules", {"state": "<b>ok</b>"}, "state:"),
        ("/jobs/broken/runs", {"limit": "<b>all-of-them</b>"}, "limit:"),
        ("/jobs/broken/runs", {"cursor": "<b>"}, "cursor:"),
        ("/jobs/ui", {"cursor": "<b>x</b>"}, "cursor:"),
        # int() of 5,000 digits raises, and "²" is a digit to str.isdigit(): not 500s.
        ("/jobs", {"limit": "<b>" + "9" * 5_000}, "limit:"),
        ("/jobs", {"limit": "9" * 5_000}, "limit:"),
        ("/jobs/broken/runs", {"cursor": RUNS_OF_MANY_DIGITS}, "cursor:"),
        ("/jobs/broken/runs", {"cursor": "cnVuczrCsg"}, "cursor:"),
    ],
)
async def test_a_bad_value_is_a_422_that_says_what_to_write_and_echoes_nothing(
    url: str, params: dict[str, str], said: str
) -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def broken() -> None: ...

    made = FastAPI(lifespan=scheduler.lifespan)
    made.include_router(scheduler.router)
    async with serve(made) as client:
        answer = await client.get(url, params=params)
    assert answer.status_code == 422
    assert said in answer.json()["detail"]
    assert "<b>" not in answer.text


async def test_one_listings_cursor_is_refused_by_another(
    app: tuple[Scheduler, httpx.AsyncClient],
) -> None:
    """A cursor names its listing: GET /jobs's is no cursor of /jobs/schedules."""
    _, client = app
    nxt = next_page(await client.get("/jobs/schedules"))
    assert nxt is not None
    cursor = nxt.rpartition("cursor=")[2]
    assert "tenant" not in cursor  # opaque: no name to build one from
    answer = await client.get("/jobs", params={"cursor": cursor})
    assert answer.status_code == 422 and "cursor:" in answer.json()["detail"]


@pytest.mark.looptime
async def test_the_runs_page_from_the_newest_and_new_runs_shift_no_page() -> None:
    """A job's runs, newest first: the cursor holds a place in its history, so
    the runs that end while a script pages do not push runs onto a second page."""
    scheduler = virtual_scheduler()

    @scheduler.every(seconds=60)
    async def beat() -> None: ...

    made = FastAPI(lifespan=scheduler.lifespan)
    made.include_router(scheduler.router)
    async with serve(made) as client:
        await anyio.sleep(HOUR)  # 60 runs: the last 50 kept
        ids: list[str] = []
        answer = await client.get("/jobs/beat/runs")
        assert answer.headers["x-total-count"] == "50"
        while True:
            ids.extend(run["id"] for run in answer.json())
            nxt = next_page(answer)
            if nxt is None:
                break
            await anyio.sleep(120)  # two more runs meanwhile
            answer = await client.get(nxt)
    numbers = [int(i.rpartition("#")[2]) for i in ids]
    assert numbers == list(range(numbers[0], numbers[0] - len(numbers), -1))
    assert len(numbers) == 20 + 20 + (50 - 40 - 4)  # the oldest 4 left the ring meanwhile


def test_the_listings_bench_runs_on_a_tiny_n() -> None:
    """`python -m bench.listings --quick` prints its table: a row per request."""
    ran = subprocess.run(
        [sys.executable, "-m", "bench.listings", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    rows = [line for line in ran.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 13 and "| GET /jobs (100) |" in ran.stdout


async def test_a_read_of_some_jobs_has_their_claims_and_every_pause(database_url: str) -> None:
    """``read_jobs``: the claims of the jobs named (a page's), with the pauses and
    instances as ``read`` has them; past 500 names, every claim."""
    async with opened(database_url) as (store, _):
        for job in ("a", "b", "c"):
            assert await claim1(store, job, 1000.0) == 1
        await store.pause("c", None)
        some = await store.read_jobs(["a", "nope"])
        whole = await store.read()
        many = await store.read_jobs([f"x{i}" for i in range(600)])
    assert set(some.jobs) == {"a"} and set(whole.jobs) == {"a", "b", "c"}
    assert some.pauses == whole.pauses and set(some.pauses) == {"c"}
    assert some.instances == whole.instances
    assert set(many.jobs) == {"a", "b", "c"}  # more than asked: allowed


async def test_an_unwell_read_has_the_claims_that_can_fail_or_run(database_url: str) -> None:
    """``read_jobs(jobs, unwell=True)``: the jobs named, those whose last run
    failed or timed out, and those whose lease is live; not the others."""
    async with opened(database_url) as (store, _):
        for job in ("ok", "named", "failed", "timed_out", "held"):
            fence = await claim1(store, job, 1000.0)
            if job != "held":  # released: its lease is over
                outcome = job if job in ("failed", "timed_out") else "ok"
                await store.release([Ended(job, fence, outcome, None, 0.1)])  # type: ignore[arg-type]
        unwell = await store.read_jobs(["named"], True)
    assert set(unwell.jobs) == {"named", "failed", "timed_out", "held"}
    assert unwell.jobs["held"].running_on is not None


async def test_a_claimed_jobs_runs_page_by_their_fences(tmp_path: Path) -> None:
    """With a store, a run's place is its claim's fence: pages of 10 of 30 runs
    go 30 to 21, 20 to 11, 10 to 1."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'runs.sqlite3'}"
    async with opened(url) as (store, _):
        for fence in range(1, 31):
            assert await claim1(store, "digest", 1000.0 + fence) == fence
            await store.release([Ended("digest", fence, "ok", None, 0.1)])
    scheduler = Scheduler(store=SQLAlchemyStore(url))

    @scheduler.every(hours=RARE)
    async def digest() -> None: ...

    made = FastAPI(lifespan=scheduler.lifespan)
    made.include_router(scheduler.router)
    pages = []
    async with serve(made) as client:
        answer = await client.get("/jobs/digest/runs", params={"limit": 10})
        assert answer.headers["x-total-count"] == "30"
        while True:
            pages.append([run["fence"] for run in answer.json()])
            nxt = next_page(answer)
            if nxt is None:
                break
            answer = await client.get(nxt)
    assert pages == [list(range(top, top - 10, -1)) for top in (30, 20, 10)]
