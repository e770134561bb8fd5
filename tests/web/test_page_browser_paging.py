"""The status page in a real browser (headless Chromium against a uvicorn
process) over 5,000 stored schedules in a SQLite file: it shows a page of them,
goes to the next, searches by name and filters by state, as a person does."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

from ..apps.page_app import HOSTILE
from ..support.cluster import App
from ..support.tools import module
from .many import LEGACY, PAUSED, TENANTS, seed, tenant
from .test_page_browser import PASSWORD, Watched

sync_api = module("playwright.sync_api")

DECLARED = ["fine", "broken", "slow", "held", "fresh", HOSTILE]


@pytest.fixture
def app(tmp_path: Path, apps: list[App]) -> App:
    url = f"sqlite+aiosqlite:///{tmp_path / 'many.sqlite3'}"
    # In a thread of its own: Playwright's sync API holds this one's event loop.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(anyio.run, seed, url).result()
    started = App(url, app="tests.apps.page_app:app", PASSWORD=PASSWORD)
    apps.append(started)
    started.wait_started()
    return started


def names(watched: Watched) -> list[str]:
    found: list[str] = watched.page.locator("tr.job th code").all_inner_texts()
    return found


def test_the_page_pages_searches_and_filters_thousands_of_schedules(browser: Any, app: App) -> None:
    context = browser.new_context(http_credentials={"username": "admin", "password": PASSWORD})
    watched = Watched(context.new_page())
    page = watched.page
    page.goto(app.base_url + "/jobs/ui")
    expect = sync_api.expect
    jobs = TENANTS + len(DECLARED)  # the legacy schedules' task is not this app's
    expect(page.locator("form.filter .sub")).to_have_text(f"showing 200 of {jobs}")
    first = names(watched)
    assert len(first) == 200 and first == sorted(first)

    page.get_by_role("link", name="Next page").click()
    expect(page.get_by_role("link", name="First page")).to_be_visible()
    second = names(watched)
    assert len(second) == 200 and second[0] > first[-1] and second == sorted(second)

    page.get_by_role("searchbox").fill("TENANT-0479")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tr.job")).to_have_count(10)
    assert names(watched) == [tenant(i) for i in range(4790, 4800)]
    expect(page.locator("form.filter .sub")).to_have_text("10 match")

    # Choosing a state applies it (the page's script submits the form).
    page.get_by_role("searchbox").fill("")
    page.get_by_role("combobox").select_option("paused")
    expect(page.locator("form.filter .sub")).to_have_text(f"{PAUSED + 1} match")
    assert names(watched) == sorted(["held", *(tenant(i) for i in range(PAUSED))])
    assert "state=paused" in page.url

    page.get_by_role("combobox").select_option("left_alone")
    expect(page.locator("section.unknown h2")).to_contain_text(f"({LEGACY})")
    expect(page.locator("tr.job")).to_have_count(0)
    assert watched.dialogs == [] and watched.errors == []
