"""The status page in a real browser: headless Chromium (the system's, driven by
Playwright) against a real uvicorn process with a store, one job in each state,
names and errors that are HTML, and HTTP Basic auth (ambient, as a browser
sends it, which is what makes CSRF possible at all)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

from fastapi_jobs import Every
from fastapi_jobs._dynamic.stored import encode

from ..apps.page_app import HOSTILE, RARE, SCRIPT_ERROR
from ..conftest import open_store
from ..support.cluster import App
from ..support.tools import module
from ..support.waiting import wait_until

sync_api = module("playwright.sync_api")

PASSWORD = "s3cret-for-the-page"
JOBS = ["fine", "broken", "slow", "held", "fresh", HOSTILE, "tenant-report"]


async def seed_schedules(url: str) -> None:
    """Schedules made at run time before the app starts: one of its task, and
    one of a task it lacks (an older release made it)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with open_store(engine) as store:
            spec = encode(Every(hours=RARE), {"tenant": "acme"}, {})
            await store.schedules.create("tenant-report", "report", spec)
            await store.schedules.create(
                "legacy-sync", "sync_ledger", encode(Every(hours=RARE), {}, {})
            )
    finally:
        await engine.dispose()


@pytest.fixture
def app(tmp_path: Path, apps: list[App]) -> App:
    url = f"sqlite+aiosqlite:///{tmp_path / 'page.sqlite3'}"
    # In a thread of its own: Playwright's sync API holds this one's event loop.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(anyio.run, seed_schedules, url).result()
    started = App(
        url,
        app="tests.apps.page_app:app",
        PASSWORD=PASSWORD,
    )
    apps.append(started)
    started.wait_started()
    return started


class Watched:
    """A browser page, with every console error, page error and dialog it had."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("dialog", self._dialog)

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def states(self) -> dict[str, str]:
        rows = self.page.locator("tr.job")
        return {
            rows.nth(k).locator("th code").inner_text(): rows.nth(k).locator(".state").inner_text()
            for k in range(rows.count())
        }


def open_page(browser: Any, app: App, **options: Any) -> Watched:
    context = browser.new_context(
        http_credentials={"username": "admin", "password": PASSWORD}, **options
    )
    watched = Watched(context.new_page())
    watched.page.goto(app.base_url + "/jobs/ui")
    return watched


def status(app: App, watched: Watched, name: str) -> dict[str, Any]:
    answer = watched.page.request.get(f"{app.base_url}/jobs")
    assert answer.ok
    return next(job for job in json.loads(answer.text()) if job["name"] == name)


def test_the_page_shows_every_job_in_its_state_and_html_as_text(browser: Any, app: App) -> None:
    watched = open_page(browser, app)
    page = watched.page
    # The startup runs have ended (slow's goes on) once broken has failed.
    wait_until(lambda: status(app, watched, "broken")["last_outcome"] == "failed", timeout=15)
    page.reload()
    assert watched.states() == {
        "fine": "ok",
        "broken": "failing",
        "slow": "running",
        "held": "paused",
        "fresh": "never ran",
        HOSTILE: "failing",
        "tenant-report": "never ran",
    }
    # A name and an error that are HTML show as text, and run nothing.
    hostile = page.locator("tr.job", has=page.locator("th code", has_text=HOSTILE))
    assert hostile.locator(".error").inner_text() == f"ValueError: {SCRIPT_ERROR}"
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    assert page.locator("tr.job.failing svg.chart rect.failed").count() == 2
    assert page.locator("section.instances tbody tr").count() == 1
    assert watched.dialogs == [] and watched.errors == []


def test_the_page_shows_the_schedules_made_at_run_time(browser: Any, app: App) -> None:
    """A stored schedule's job says so under its schedule, with its task; the one
    whose task this release lacks is listed once, below, saying why, and is no
    job here."""
    watched = open_page(browser, app)
    page = watched.page
    row = page.locator("tr.job", has=page.locator("th code", has_text="tenant-report"))
    assert row.locator(".made").inner_text() == "made at run time · task report"
    assert page.locator("tr.job .made").count() == 1
    unknown = page.locator("section.unknown")
    assert unknown.locator("h2").inner_text() == "Schedules this instance cannot run (1)"
    assert unknown.locator("li").all_inner_texts() == [
        "legacy-sync (task sync_ledger): it names the task 'sync_ledger', which this instance lacks"
    ]
    assert "legacy-sync" not in watched.states()
    listed = json.loads(page.request.get(f"{app.base_url}/jobs/schedules").text())
    assert [(s["name"], s["known"]) for s in listed] == [
        ("legacy-sync", False),
        ("tenant-report", True),
    ]
    assert watched.errors == []


def test_the_buttons_pause_resume_and_run_a_job(browser: Any, app: App) -> None:
    watched = open_page(browser, app)
    page = watched.page
    row = page.locator("tr.job", has=page.locator("th code", has_text="fresh"))
    row.get_by_role("button", name="Pause").click()
    page.wait_for_url("**/jobs/ui")  # the 303 back, then the notice leaves the address
    assert page.locator(".notice").inner_text() == "fresh is paused."
    assert row.locator(".state").inner_text() == "paused"
    assert status(app, watched, "fresh")["paused"] is True

    row.get_by_role("button", name="Resume").click()
    page.wait_for_url("**/jobs/ui")
    assert page.locator(".notice").inner_text() == "fresh is resumed."
    assert status(app, watched, "fresh")["paused"] is False

    row.get_by_role("button", name="Run now").click()
    page.wait_for_url("**/jobs/ui")
    assert page.locator(".notice").inner_text() == "Run of fresh started."
    wait_until(lambda: status(app, watched, "fresh")["last_outcome"] == "ok", timeout=15)

    # The running job: a second run is refused, and the page says why.
    slow = page.locator("tr.job", has=page.locator("th code", has_text="slow"))
    slow.get_by_role("button", name="Run now").click()
    page.wait_for_url("**/jobs/ui")
    assert page.locator(".notice").inner_text() == "slow is running already: not started again."

    # The hostile name's buttons reach its job (its name is escaped in the URL).
    hostile = page.locator("tr.job", has=page.locator("th code", has_text=HOSTILE))
    hostile.get_by_role("button", name="Pause").click()
    page.wait_for_url("**/jobs/ui")
    assert status(app, watched, HOSTILE)["paused"] is True
    assert watched.dialogs == [] and watched.errors == []


def test_the_page_refreshes_itself_in_place(browser: Any, app: App) -> None:
    watched = open_page(browser, app)
    page = watched.page
    page.evaluate("document.getElementById('jobs').dataset.marker = 'old'")
    countdown = page.locator("tr.job time[data-countdown]").first
    # fresh runs on another tab (the API): this page shows it without a reload.
    answer = page.request.post(f"{app.base_url}/jobs/fresh/run?wait=true")
    assert answer.status == 200
    # (Polled from here: the page's CSP forbids the eval of wait_for_function.)
    replaced = "() => document.getElementById('jobs').dataset.marker === undefined"
    wait_until(lambda: page.evaluate(replaced), timeout=15)
    fresh = page.locator("tr.job", has=page.locator("th code", has_text="fresh"))
    sync_api.expect(fresh.locator(".state")).to_have_text("ok", timeout=10_000)
    # The countdowns tick each second, on the server's clock.
    page.evaluate(
        "() => document.querySelector('tr.job time[data-countdown]')"
        ".setAttribute('datetime', new Date(Date.now() + 75500).toISOString())"
    )
    wait_until(lambda: re.fullmatch(r"in 1m 1[0-5]s", countdown.inner_text()) is not None)
    assert watched.errors == []


def test_another_sites_form_cannot_operate_jobs(browser: Any, app: App) -> None:
    """A page elsewhere posting to the control endpoints: the browser sends the
    Basic credentials along (that is CSRF), and the app refuses."""
    watched = open_page(browser, app)
    page = watched.page
    page.goto("about:blank")
    page.set_content(
        f'<form method="post" action="{app.base_url}/jobs/fine/pause">'
        '<button type="submit">win a prize</button></form>'
    )
    with page.expect_navigation():
        page.get_by_role("button").click()
    assert "cross-origin request refused" in page.content()
    assert status(app, watched, "fine")["paused"] is False


def test_the_page_fits_a_phone_in_the_dark(browser: Any, app: App, tmp_path: Path) -> None:
    watched = open_page(browser, app, viewport={"width": 390, "height": 844}, color_scheme="dark")
    page = watched.page
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(13, 17, 23)"  # the dark palette
    page.screenshot(path=tmp_path / "phone.png", full_page=True)
    assert watched.errors == []


@pytest.mark.slow  # an app process of its own: seconds
def test_a_forgotten_lifespan_is_said_on_the_page_and_once_in_the_log(
    browser: Any, tmp_path: Path, apps: list[App]
) -> None:
    """Under plain uvicorn, an app that includes the router but not the lifespan:
    the page says, in a banner that fits a phone, that the scheduler never
    started and what to write; the log says it once, however often the page
    asks."""
    started = App(
        f"sqlite+aiosqlite:///{tmp_path / 'forgotten.sqlite3'}",
        app="tests.apps.page_app:app",
        PASSWORD=PASSWORD,
        FORGET_LIFESPAN=1,
    )
    apps.append(started)
    started.wait_started()
    watched = open_page(browser, started, viewport={"width": 390, "height": 844})
    page = watched.page
    banner = page.locator(".notice[role=alert]")
    assert banner.is_visible()
    assert banner.inner_text().startswith("The scheduler never started, so no job runs")
    assert "FastAPI(lifespan=scheduler.lifespan)" in banner.inner_text()
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
    page.reload()
    page.reload()
    assert page.locator(".notice[role=alert]").is_visible()
    assert started.output().count("the scheduler never started, so no job runs") == 1
    assert "ERROR" in started.output() and watched.errors == []
