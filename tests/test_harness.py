"""The suite's own tools hold when the machine is loaded: the uvicorn harness
(tests/cluster.py) and the pauser (tests/pauses.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from .cluster import App


def test_an_app_counts_as_started_once_it_listens(tmp_path: Path, apps: list[App]) -> None:
    """`App.wait_started` returns once uvicorn has bound its port and said where, even
    when that comes a second after the app's startup: `base_url` is then known."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'harness.sqlite3'}"
    app = App(url, INTERVAL=3600, BIND_DELAY=1)
    apps.append(app)
    app.wait_started()
    assert httpx.get(app.base_url + "/jobs", timeout=10).status_code == 200

