"""The docs site as a reader sees it, in a real browser: built as .ci/run builds it,
every page of the user's site read at 1,280 px (a laptop) and at 390 px (a phone)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..support.sentences import user_pages

ROOT = Path(__file__).resolve().parents[2]
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

# The site's build and a browser over every page: ~25 s of one worker, which the
# README's 4-minute command cannot take; .ci/run's slow pass runs them.
pytestmark = pytest.mark.slow

# Code and output blocks whose content is wider than the block: the reader would
# scroll sideways inside them. Tables are measured the same way.
WIDER_THAN_SHOWN = """() => [
    ...document.querySelectorAll('.md-content pre > code, .md-typeset__table')]
    .filter(element => element.scrollWidth > element.clientWidth + 1)
    .map(element => element.innerText.split('\\n')
        .reduce((longest, line) => line.length > longest.length ? line : longest, ''))"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(built)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return built


def pages(site: Path) -> Iterator[tuple[str, Path]]:
    """Each page of the user's site (the nav's), as the built HTML file."""
    for page in user_pages()[1:]:  # the README is not a page of the site
        relative = page.relative_to(ROOT / "docs").with_suffix("")
        html = site / ("index.html" if relative.name == "index" else relative / "index.html")
        assert html.is_file(), html
        yield str(relative), html


def test_at_1280_px_no_code_block_scrolls_sideways(site: Path, browser: Any) -> None:
    """Commands, code and output are read whole on a laptop: long commands are
    wrapped by hand, what a program printed wraps by itself (docs/stylesheets)."""
    page = browser.new_page(viewport=LAPTOP)
    wide, blocks = {}, 0
    for name, html in pages(site):
        page.goto(html.as_uri())
        blocks += page.locator(".md-content pre > code").count()
        if lines := page.evaluate(WIDER_THAN_SHOWN):
            wide[name] = lines
    assert not wide, wide
    assert blocks > 100  # the selector finds the pages' blocks


def test_on_a_phone_only_code_scrolls_sideways(site: Path, browser: Any) -> None:
    """At 390 px a long line of code scrolls inside its block; the page itself
    never scrolls sideways, so the prose is read without it."""
    page = browser.new_page(viewport=PHONE)
    wide = []
    for name, html in pages(site):
        page.goto(html.as_uri())
        if page.evaluate("() => document.documentElement.scrollWidth") > PHONE["width"]:
            wide.append(name)
    assert not wide, wide


def test_copying_a_terminal_block_copies_its_commands_alone(site: Path, browser: Any) -> None:
    """The tutorial's blocks show `$ ` prompts and output; the copy button gives
    what the reader pastes into a terminal: the commands, one a line."""
    page = browser.new_page(viewport=LAPTOP)
    page.goto((site / "tutorial" / "index.html").as_uri())
    copied = page.evaluate(
        """() => [...document.querySelectorAll('.language-console pre > code')].map(code => {
            code.setAttribute('data-md-copying', '');  // as Material's copy button does
            const text = code.innerText.trimEnd();
            code.removeAttribute('data-md-copying');
            return text;
        })"""
    )
    assert (
        copied[0]
        == "mkdir jobs-tutorial\ncd jobs-tutorial\npython3 -m venv .venv\n. .venv/bin/activate"
    )
    # A block with output: the command alone.
    assert copied[2] == "uvicorn main:app"
    assert not [text for text in copied if "$ " in text or "INFO" in text]
