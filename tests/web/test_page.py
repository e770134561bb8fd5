"""The status page's HTML and the control endpoints' browser side, over ASGI on
virtual time (tests/web/test_page_browser.py drives it in a real browser)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import anyio
import pytest
from fastapi import APIRouter, FastAPI

from fastapi_jobs import Every, Scheduler
from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import HOUR, serve, virtual_scheduler
from ..stores.test_store import opened

HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def rows(page: str) -> dict[str, str]:
    """Each job row's escaped name, and its state."""
    return dict(
        re.findall(
            r'<tr class="job [^"]*" data-job="([^"]*)">.*?class="state [^"]*">([^<]*)<', page
        )
    )


def page_row(page: str, job: str) -> str:
    """The HTML of one job's row."""
    start = page.index(f'data-job="{job}"')
    return page[start : page.index("</tr>", start)]


def make_app(scheduler: Scheduler, *, control: bool = True, prefix: str = "") -> FastAPI:
    app = FastAPI(lifespan=scheduler.lifespan)
    outer = APIRouter(prefix=prefix)
    outer.include_router(scheduler.router)
    if control:
        outer.include_router(scheduler.control_router(public=True))
    app.include_router(outer)
    return app


@pytest.mark.looptime
async def test_no_credential_an_error_quotes_reaches_the_status_or_the_page() -> None:
    """Any error may quote a URL or a setting (an HTTP client's, a broker's,
    the job's own): its credentials and secret-like values are hidden on
    ``/jobs`` and the page, as a database error's quoted values are; the rest
    of the line stays, to say what went wrong."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1, name="leaky")
    async def leaky() -> None:
        raise RuntimeError(
            "connect failed: redis://admin:hunter2@cache:6379/0 password=hunter3 "
            '{"api_key": "sk_live_abc"}'
        )

    async with serve(make_app(scheduler)) as client:
        await anyio.sleep(HOUR + 1)
        status = (await client.get("/jobs/leaky")).json()
        page = (await client.get("/jobs/ui")).text
    message = status["last_error"]["message"]
    assert message == (
        'connect failed: redis://[hidden]@cache:6379/0 password=[hidden] {"api_key": "[hidden]"}'
    )
    for secret in ("hunter2", "hunter3", "sk_live_abc", "admin"):
        assert secret not in message and secret not in page


@pytest.mark.looptime
async def test_the_page_escapes_every_name_and_error_and_says_each_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1, name="fine")
    async def fine() -> None: ...

    @scheduler.every(hours=1, name='<img src=x onerror="alert(1)">')
    async def hostile() -> None:
        raise ValueError("<script>alert('x')</script>\nsecond line with a password=hunter2")

    @scheduler.every(hours=1, name="held", paused=True)
    async def held() -> None: ...

    @scheduler.every(hours=2, name="fresh")
    async def fresh() -> None: ...

    with caplog.at_level(logging.INFO, logger="fastapi_jobs"):
        async with serve(make_app(scheduler)) as client:
            await anyio.sleep(HOUR + 1)
            answer = await client.get("/jobs/ui")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    # A paused job counts down to no tick: its ticks are skipped. Its start-up line
    # says it is paused.
    held_row = page_row(answer.text, "held")
    assert "data-countdown" not in held_row and "none while paused" in held_row
    assert "data-countdown" in page_row(answer.text, "fine")
    [started] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job 'held'")]
    assert started.endswith(", paused")
    csp = answer.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert answer.headers["cache-control"] == "no-store"
    page = answer.text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "hunter2" not in page  # the error's first line only, as in /jobs
    assert rows(page) == {
        "fine": "ok",
        "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;": "failing",
        "held": "paused",
        "fresh": "never ran",
    }
    # The hostile name's buttons post to its own, percent-encoded, URL.
    assert 'action="/jobs/%3Cimg%20src%3Dx%20onerror%3D%22alert%281%29%22%3E/run"' in page
    assert page.count('<script src="/jobs/ui/ui.js?v=') == 1 and "<style" not in page


@pytest.mark.looptime
async def test_without_the_control_router_the_page_has_no_buttons_and_prefixes_hold() -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    async with serve(make_app(scheduler, control=False, prefix="/admin")) as client:
        page = (await client.get("/admin/jobs/ui")).text
        css = re.search(r'href="(/admin/jobs/ui/ui\.css\?v=\w+)"', page)
        js = re.search(r'src="(/admin/jobs/ui/ui\.js\?v=\w+)"', page)
        assert css and js
        style = await client.get(css.group(1))
        script = await client.get(js.group(1))
        missing = await client.get("/admin/jobs/ui/secrets.txt")
    assert "<form" not in page and "digest" in page
    assert style.headers["content-type"].startswith("text/css")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "immutable" in style.headers["cache-control"]
    assert missing.status_code == 404


@pytest.mark.looptime
async def test_a_form_gets_a_redirect_to_the_page_and_an_api_call_gets_json() -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def digest() -> None:
        await anyio.sleep(60)

    async with serve(make_app(scheduler, prefix="/admin")) as client:
        paused = await client.post("/admin/jobs/digest/pause", headers=HTML)
        assert paused.status_code == 303
        assert paused.headers["location"] == "/admin/jobs/ui?notice=paused&job=digest"
        page = (await client.get(paused.headers["location"])).text
        assert "<code>digest</code> is paused." in page
        assert (await client.post("/admin/jobs/digest/resume")).json()["paused"] is False
        started = await client.post("/admin/jobs/digest/run", headers=HTML)
        assert started.headers["location"].endswith("notice=started&job=digest")
        again = await client.post("/admin/jobs/digest/run", headers=HTML)
        assert again.status_code == 303
        assert again.headers["location"].endswith("notice=running&job=digest")
        unknown = await client.post("/admin/jobs/nope/run", headers=HTML)
        assert unknown.headers["location"].endswith("notice=unknown&job=nope")
        page = (await client.get(unknown.headers["location"])).text
        assert "No job has that name." in page and "nope" not in page
        # A notice the page does not know is not shown; nor is text from the address.
        page = (await client.get("/admin/jobs/ui?notice=<b>hi</b>&job=digest")).text
        assert "hi</b>" not in page and 'class="notice' not in page


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, True),  # not a browser: curl, httpx, the CLI
        ({"Sec-Fetch-Site": "same-origin"}, True),
        ({"Sec-Fetch-Site": "none"}, True),  # typed in the address bar, a bookmark
        ({"Sec-Fetch-Site": "cross-site"}, False),
        ({"Sec-Fetch-Site": "same-site"}, False),  # another subdomain
        ({"Origin": "http://test"}, True),  # older browsers: Origin against Host
        ({"Origin": "HTTP://Test"}, True),  # schemes and hosts are not case-sensitive
        ({"Origin": "https://test"}, False),  # another scheme: another origin
        ({"Origin": "http://test:8080"}, False),  # another port: another origin
        ({"Origin": "http://evil.example"}, False),
        ({"Origin": "null"}, False),  # a sandboxed frame, a data: page
    ],
)
async def test_control_endpoints_refuse_cross_origin_browser_requests(
    headers: dict[str, str], allowed: bool
) -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    async with serve(make_app(scheduler)) as client:
        answer = await client.post("/jobs/digest/pause", headers=headers)
        state = (await client.get("/jobs/digest")).json()
    if allowed:
        assert answer.status_code == 200 and state["paused"] is True
    else:
        assert answer.status_code == 403 and state["paused"] is False
        assert "cross-origin" in answer.json()["detail"]


async def test_with_a_store_the_page_shows_the_instances_and_the_claimed_runs(
    tmp_path: Path,
) -> None:
    # The default timeout: SQLite on a loaded machine is slow to answer.
    store = SQLAlchemyStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}")
    scheduler = Scheduler(store=store)
    calls: list[int] = []

    @scheduler.every(seconds=1)
    async def digest() -> None:
        calls.append(1)
        if len(calls) % 2:
            raise ConnectionError("smtp refused")

    async with serve(make_app(scheduler)) as client:
        with anyio.fail_after(15):
            while len(await scheduler.runs("digest")) < 3:  # noqa: ASYNC110 - the store's
                await anyio.sleep(0.1)
        page = (await client.get("/jobs/ui")).text
    assert "Instances (1)" in page and scheduler.instance.id in page
    chart = re.search(r'<svg class="chart".*?</svg>', page)
    assert chart is not None
    assert chart.group(0).count('<rect class="failed"') >= 1
    assert chart.group(0).count('<rect class="ok"') >= 1


async def test_with_the_store_down_the_page_still_answers_and_says_so() -> None:
    store = SQLAlchemyStore(
        "postgresql+asyncpg://nobody:x@127.0.0.1:1/none", lease=3, timeout=0.5, heartbeat=1
    )
    scheduler = Scheduler(store=store)

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    async with serve(make_app(scheduler)) as client:
        answer = await client.get("/jobs/ui")
    assert answer.status_code == 200
    assert "The store cannot be read" in answer.text and "digest" in answer.text


async def test_recent_runs_reads_the_last_runs_of_many_jobs_at_once(database_url: str) -> None:
    from fastapi_jobs.stores import Ended

    from ..conftest import claim1

    async with opened(database_url) as (store, _):
        for job, count in (("a", 5), ("b", 2)):
            for fence in range(1, count + 1):
                assert await claim1(store, job, 1000.0 + fence) == fence
                await store.release([Ended(job, fence, "ok", None, 0.1 * fence)])
        recent = await store.recent_runs(["a", "b", "never"], 3)
    assert [r.fence for r in recent["a"]] == [5, 4, 3]
    assert [r.fence for r in recent["b"]] == [2, 1]
    assert recent["never"] == []


@pytest.mark.looptime
async def test_a_page_of_thousands_of_jobs_shows_a_bounded_part_and_filters() -> None:
    scheduler = virtual_scheduler()

    async def job() -> None: ...

    for n in range(1000):
        scheduler.add_job(job, Every(hours=1), name=f"job{n:04d}")
    async with serve(make_app(scheduler)) as client:
        await anyio.sleep(HOUR + 1)
        page = (await client.get("/jobs/ui")).text
        filtered = (await client.get("/jobs/ui", params={"q": "JOB09"})).text
        nothing = (await client.get("/jobs/ui", params={"q": "<none>"})).text
        too_long = await client.get("/jobs/ui", params={"q": "x" * 201})
    assert len(rows(page)) == 200 and "1000 jobs" in page
    assert "showing 200 of 1000" in page and 'name="q"' in page
    assert list(rows(filtered)) == [f"job{n:04d}" for n in range(900, 1000)]
    assert "100 match" in filtered and 'value="JOB09"' in filtered
    assert rows(nothing) == {} and "0 match" in nothing and 'value="&lt;none&gt;"' in nothing
    assert too_long.status_code == 422


async def test_the_page_says_which_jobs_are_schedules_and_which_it_cannot_run(
    tmp_path: Path,
) -> None:
    """A stored schedule's row names its task; the schedules whose task this
    release lacks are listed once, below the jobs, their names as text."""
    from fastapi_jobs._dynamic.stored import encode

    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    hostile = "<img src=x onerror=alert(1)>"
    async with opened(url) as (store, _):
        spec = encode(Every(hours=240), {}, {})
        await store.schedules.create("legacy-sync", "gone_task", spec)
        await store.schedules.create(hostile, "<b>old</b>", spec)
        # Made for a release whose task took "tenant_id": this one's takes "tenant".
        renamed = encode(Every(hours=240), {"tenant_id": "a"}, {})
        await store.schedules.create("renamed-arg", "report", renamed)
    scheduler = Scheduler(store=SQLAlchemyStore(url, timeout=1, heartbeat=0.2))

    @scheduler.task()
    async def report(tenant: str) -> None: ...

    @scheduler.every(hours=1)
    async def declared() -> None: ...

    async with serve(make_app(scheduler)) as client:
        await scheduler.add_schedule("acme", "report", Every(hours=1), kwargs={"tenant": "a"})
        page = (await client.get("/jobs/ui")).text
    assert "made at run time · task <code>report</code>" in page_row(page, "acme")
    assert "made at run time" not in page_row(page, "declared")
    assert set(rows(page)) == {"declared", "acme"}  # the unknown ones are no jobs here
    section = page[page.index('<section class="unknown">') :]
    section = section[: section.index("</section>")]
    assert "Schedules this instance cannot run (3)" in section
    assert "<li><code>legacy-sync</code> (task <code>gone_task</code>): " in section
    assert "names the task &#x27;gone_task&#x27;, which this instance lacks" in section
    # Its task is here; the arguments it was made with are what this one lacks.
    renamed_item = section[section.index("<code>renamed-arg</code>") :].split("</li>")[0]
    assert "takes no argument &#x27;tenant_id&#x27;" in renamed_item
    assert "not in this release" not in section
    assert "<code>&lt;img src=x onerror=alert(1)&gt;</code>" in section
    assert "(task <code>&lt;b&gt;old&lt;/b&gt;</code>)" in section
    assert "<img" not in page and "<b>" not in page


@pytest.mark.looptime
async def test_a_page_without_stored_schedules_has_no_such_section() -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def declared() -> None: ...

    async with serve(make_app(scheduler)) as client:
        page = (await client.get("/jobs/ui")).text
    assert 'class="unknown"' not in page and "made at run time" not in page


@pytest.mark.looptime
async def test_a_job_row_says_its_overlap_policy_and_jitter() -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1, overlap="queue_one", jitter=300)
    async def kept() -> None: ...

    @scheduler.every(hours=1, overlap="replace")
    async def replaced() -> None: ...

    @scheduler.every(hours=1)
    async def plain() -> None: ...

    async with serve(make_app(scheduler)) as client:
        page = (await client.get("/jobs/ui", headers=HTML)).text
        listed = {job["name"]: job for job in (await client.get("/jobs")).json()}
    assert "a tick during a run waits for it (one)" in page_row(page, "kept")
    assert "jitter 0:05:00 (+" in page_row(page, "kept")
    assert "a tick during a run replaces it" in page_row(page, "replaced")
    assert "a tick during a run" not in page_row(page, "plain")
    assert (listed["kept"]["overlap"], listed["kept"]["jitter"]) == ("queue_one", 300.0)
    assert (listed["plain"]["overlap"], listed["plain"]["jitter"]) == ("skip", None)
