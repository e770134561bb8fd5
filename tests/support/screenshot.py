"""Take the docs' screenshot of the example app's status page.

    python -m tests.support.screenshot   # writes docs/guides/status-page.png

Starts the example app (uvicorn, a temporary SQLite file), runs its jobs a few
times through the control endpoints (refresh_rates fails every third call), and
photographs /jobs/ui in headless Chromium.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from .ports import free_port
from .waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "screenshot-token"


def main() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        env = {
            **os.environ,
            "JOBS_TOKEN": TOKEN,
            "PORT": str(port),
            "DATABASE_URL": f"sqlite+aiosqlite:///{folder}/example.sqlite3",
        }
        app = subprocess.Popen([sys.executable, "-m", "example_app"], cwd=ROOT, env=env)
        try:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            wait_until(lambda: _up(base + "/jobs", auth), timeout=30)
            for name in ("send_digest", "expire_sessions"):
                httpx.post(f"{base}/jobs/{name}/run?wait=true", headers=auth, timeout=30)
            for _ in range(10):  # until its upstream fails: the page shows a failing job
                time.sleep(0.3)
                httpx.post(f"{base}/jobs/refresh_rates/run?wait=true", headers=auth, timeout=30)
                status = httpx.get(f"{base}/jobs/refresh_rates", headers=auth).json()
                if status["last_outcome"] == "failed":
                    break
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                    args=["--no-sandbox"],
                )
                page = browser.new_page(
                    viewport={"width": 1100, "height": 520},
                    http_credentials={"username": "admin", "password": TOKEN},
                    color_scheme="light",
                )
                page.goto(base + "/jobs/ui")
                page.screenshot(path=ROOT / "docs" / "guides" / "status-page.png", full_page=True)
                browser.close()
        finally:
            app.terminate()
            app.wait(timeout=30)


def _up(url: str, headers: dict[str, str]) -> bool:
    try:
        return httpx.get(url, headers=headers, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
