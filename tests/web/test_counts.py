"""Whose counts a status shows: with a store, the runs of every instance
(`cluster.runs`, from the claims the store keeps) beside this process's own,
on /jobs and on the page; without one, the page says its count is this
process's."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest
from fastapi import FastAPI

from fastapi_jobs import Scheduler
from fastapi_jobs.stores import Ended, SQLAlchemyStore

from ..conftest import HOUR, claim1, serve, virtual_scheduler
from ..stores.test_store import opened

RARE = 240  # hours: no tick during a test
ELSEWHERE = 40  # runs another instance had


def runs_said(page: str, job: str) -> str:
    """What the page's row of ``job`` says of its runs."""
    row = page.partition(f'data-job="{job}"')[2].partition("</tr>")[0]
    found = re.search(r'<span class="sub runs">([^<]*)</span>', row)
    assert found is not None, row
    return found.group(1)


async def test_the_status_shows_the_runs_of_every_instance_beside_this_ones(
    tmp_path: Path,
) -> None:
    """Another instance ran the job 40 times and this one once: /jobs says runs 1
    (this process) and cluster.runs 41 (every instance, as the store counts its
    claims), and the page says 41 runs on all instances, not 1."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'counts.sqlite3'}"
    async with opened(url) as (store, _):
        for fence in range(1, ELSEWHERE + 1):
            assert await claim1(store, "digest", 1000.0 + fence) == fence
            await store.release([Ended("digest", fence, "ok", None, 0.1)])
    scheduler = Scheduler(store=SQLAlchemyStore(url))

    @scheduler.every(hours=RARE)
    async def digest() -> None: ...

    made = FastAPI(lifespan=scheduler.lifespan)
    made.include_router(scheduler.router)
    made.include_router(scheduler.control_router(public=True))
    async with serve(made) as client:
        ran = await client.post("/jobs/digest/run", params={"wait": "true"})
        assert ran.status_code == 200, ran.text
        (job,) = (await client.get("/jobs")).json()
        one = (await client.get("/jobs/digest")).json()
        page = (await client.get("/jobs/ui")).text
    assert (job["runs"], job["cluster"]["runs"]) == (1, ELSEWHERE + 1)
    assert one["cluster"]["runs"] == one["cluster"]["fence"] == ELSEWHERE + 1
    assert runs_said(page, "digest") == f"{ELSEWHERE + 1} runs on all instances"


@pytest.mark.looptime
async def test_without_a_store_the_page_says_its_count_is_this_processs() -> None:
    """No store keeps a count of every process's runs: the page says whose its is."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def beat() -> None: ...

    @scheduler.every(hours=1, paused=True)
    async def held() -> None: ...

    made = FastAPI(lifespan=scheduler.lifespan)
    made.include_router(scheduler.router)
    async with serve(made) as client:
        await anyio.sleep(2 * HOUR + 1)
        page = (await client.get("/jobs/ui")).text
    assert runs_said(page, "beat") == "2 runs in this process"
    assert runs_said(page, "held") == "0 runs in this process"
