"""The tutorial (docs/tutorial.md), done as a newcomer does it: every command on the
page typed as written, in a fresh folder outside the checkout, in a virtual
environment the page makes, with the package installed from the clone beside that
folder (this checkout). A step that fails, or does not do what the page says it
does, fails.
"""

from __future__ import annotations

import importlib
import json
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from ..support.newcomer import Command, File, Terminal, steps

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "tutorial.md").read_text()
HELLO = re.compile(r"\[(\d+)\] fastapi_jobs\.say_hello: hello from tick (\S+ \S+)")
INTERVAL = 5  # the tutorial's job: every(seconds=5)


def hellos(log: str) -> list[tuple[int, datetime]]:
    """The job's lines in a log: (process id, tick)."""
    return [(int(pid), datetime.fromisoformat(tick)) for pid, tick in HELLO.findall(log)]


@pytest.fixture
def newcomer(tmp_path: Path) -> Iterator[Terminal]:
    """A terminal in an empty folder outside the checkout, with no environment of
    the suite's, and the clone the page installs from beside it: this checkout,
    as ``fastapi_jobs``."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "fastapi_jobs").symlink_to(ROOT, target_is_directory=True)
    with socket.socket() as sock:
        # The page's URLs say 127.0.0.1:8000, uvicorn's default: the test uses them as written.
        if sock.connect_ex(("127.0.0.1", 8000)) == 0:
            pytest.fail(
                "port 8000 is in use: the tutorial's app needs it (is the example app running?)"
            )
    terminal = Terminal.fresh(home)
    try:
        yield terminal
    finally:
        terminal.kill()


def test_the_page_has_every_step_the_issue_asks_for() -> None:
    """Install, a job, run it, the status, a store, three workers, a pause, a test."""
    lines = [step.line for step in steps(PAGE) if isinstance(step, Command)]
    files = [step.name for step in steps(PAGE) if isinstance(step, File)]
    assert any(line.startswith("pip install '../fastapi_jobs[sqlite]'") for line in lines)
    assert "uvicorn main:app" in lines
    assert "curl http://127.0.0.1:8000/jobs" in lines
    assert "uvicorn main:app --workers 3" in lines
    assert any(line.endswith("/jobs/say_hello/pause") for line in lines)
    assert "pytest" in lines
    assert files.count("main.py") == 3 and "test_main.py" in files


async def test_the_last_apps_status_page_opens_in_a_browser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 7's auth lets a browser in, which cannot send a Bearer header by
    itself: no credentials get a 401 with the Basic challenge (a browser then
    asks for the password), the token as Basic's password opens /jobs/ui, and
    the Bearer token still works for curl."""
    last = [step for step in steps(PAGE) if isinstance(step, File) and step.name == "main.py"][-1]
    (tmp_path / "tutorial_main.py").write_text(last.text)
    monkeypatch.chdir(tmp_path)  # its store's SQLite file, were it opened
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tutorial_main", raising=False)
    monkeypatch.setenv("JOBS_TOKEN", "change-me")
    app = importlib.import_module("tutorial_main").app
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as browser:
        challenged = await browser.get("/jobs/ui")
        wrong = await browser.get("/jobs/ui", auth=("admin", "nope"))
        opened = await browser.get("/jobs/ui", auth=("anyone", "change-me"))
        scripted = await browser.get("/jobs", headers={"Authorization": "Bearer change-me"})
    assert challenged.status_code == wrong.status_code == 401
    assert challenged.headers["www-authenticate"] == "Basic"
    assert opened.status_code == 200 and "<h1>Jobs</h1>" in opened.text
    assert scripted.status_code == 200


@pytest.mark.slow  # a fresh install from the clone and the index, and a minute of real ticks
@pytest.mark.timeout(600)  # minutes of pip on a loaded machine: 120 s was cut
def test_the_tutorial_runs_as_written(newcomer: Terminal) -> None:
    for step in steps(PAGE):
        if isinstance(step, File):
            newcomer.save(step)
            continue
        out = newcomer.run(step)
        check(newcomer, step, out)
    newcomer.stop()
    assert newcomer.ran, "the page has no commands"


def check(terminal: Terminal, command: Command, out: str) -> None:
    """What the page says a command does, it does."""
    line = command.line
    if "..." not in command.shown and command.shown.strip() and "uvicorn" not in line:
        # An output the page shows whole is the output the reader gets.
        assert out.strip() == command.shown.strip(), (line, out)
    if line.startswith("pip install '../fastapi_jobs"):
        _installed_from_this_checkout(terminal)
    elif line == "uvicorn main:app":
        assert terminal.server is not None
        log = terminal.server.wait_for(
            lambda t: len(hellos(t)) >= 2, 4 * INTERVAL, "two hello lines"
        )
        assert "in this process (no store)" in log
    elif line == "curl http://127.0.0.1:8000/jobs":
        (job,) = json.loads(out)
        assert job["name"] == "say_hello" and job["schedule"] == "every 5s"
        assert job["runs"] >= 1 and job["failures"] == 0
    elif line == "uvicorn main:app --workers 3":
        assert terminal.server is not None
        log = terminal.server.wait_for(lambda t: len(hellos(t)) >= 4, 8 * INTERVAL, "four ticks")
        _each_tick_once(log)
        assert log.count("claimed in the store (one instance per tick)") == 3
    elif line == "curl http://127.0.0.1:8000/jobs/say_hello/runs":
        runs = json.loads(out)
        ticks = [run["tick"] for run in runs]
        assert len(runs) >= 4 and len(ticks) == len(set(ticks)), runs
        assert {run["outcome"] for run in runs} == {"ok"}
    elif line.startswith("JOBS_TOKEN=change-me uvicorn"):
        assert terminal.server is not None
        terminal.server.wait_for(lambda t: len(hellos(t)) >= 1, 4 * INTERVAL, "a hello line")
    elif line.endswith("/jobs/say_hello/pause"):
        _nothing_runs_while_paused(terminal)
    elif line.endswith("/jobs/say_hello/resume"):
        assert terminal.server is not None
        before = len(hellos(terminal.server.text()))
        log = terminal.server.wait_for(
            lambda t: len(hellos(t)) > before, 4 * INTERVAL, "a run after the resume"
        )
        _each_tick_once(log)
    elif line == "pytest":
        assert re.search(r"\b1 passed\b", out) and "warning" not in out.lower(), out


def _installed_from_this_checkout(terminal: Terminal) -> None:
    """The package installed is this checkout's, copied into the environment (not
    a project of the index of the same import name, nor the checkout on a path)."""
    python = Path(terminal.env["VIRTUAL_ENV"]) / "bin" / "python"
    found = subprocess.run(
        [python, "-c", "import fastapi_jobs._scheduler as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=terminal.env,
        cwd=terminal.cwd,  # python -c imports from its folder first: not the checkout's
    ).stdout.strip()
    assert Path(found).read_text() == (ROOT / "fastapi_jobs" / "_scheduler.py").read_text()
    assert Path(found).is_relative_to(terminal.env["VIRTUAL_ENV"])


def _each_tick_once(log: str) -> None:
    counts = Counter(tick for _, tick in hellos(log))
    assert counts and max(counts.values()) == 1, counts


def _nothing_runs_while_paused(terminal: Terminal) -> None:
    """No worker runs a tick due after the pause answered; a tick already being
    claimed as it came may still run."""
    assert terminal.server is not None
    paused_at = datetime.now(UTC)
    time.sleep(3 * INTERVAL)  # three ticks' time: the app's own clock, not a virtual one
    late = [(pid, tick) for pid, tick in hellos(terminal.server.text()) if tick > paused_at]
    assert not late, late
