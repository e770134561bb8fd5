"""Headless Chromium, the system's (Debian's package), driven by Playwright: the
status page's tests and the docs site's layout test use it through the ``browser``
fixture (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .tools import module, program


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched browser; the test skips without Chromium, and fails in CI."""
    sync_api = module("playwright.sync_api")
    found = program("chromium", "apt-get install chromium", at="/usr/bin/chromium")
    with sync_api.sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start.
        launched = playwright.chromium.launch(executable_path=found, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()
