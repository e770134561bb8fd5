"""The suite's own tools hold: the uvicorn harness (tests/support/cluster.py) and
the pauser (tests/support/pauses.py) when the machine is loaded, and a tool that
is missing fails CI (tests/support/tools.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ..conftest import serving
from ..support.cluster import ROOT, App
from ..support.postgres import PostgresServer
from ..support.tools import module, program


def test_an_app_counts_as_started_once_it_listens(tmp_path: Path, apps: list[App]) -> None:
    """`App.wait_started` returns once uvicorn has bound its port and said where, even
    when that comes a second after the app's startup: `base_url` is then known."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'harness.sqlite3'}"
    app = App(url, INTERVAL=3600, BIND_DELAY=1)
    apps.append(app)
    app.wait_started()
    assert httpx.get(app.base_url + "/jobs", timeout=10).status_code == 200


PROBE = '''
import time


def wait_for_a_stop() -> None:
    """Until this process is stopped for most of a second (20 s at most)."""
    last = time.monotonic()
    deadline = last + 20
    while last < deadline:
        time.sleep(0.01)
        before, last = last, time.monotonic()
        if last - before > 0.8:
            return
    raise AssertionError("this process was never stopped")


def test_one() -> None:
    wait_for_a_stop()


def test_two() -> None:
    wait_for_a_stop()
'''


@pytest.mark.slow  # minutes of real processes: CI's second run (pytest -m slow)
def test_the_pauser_stops_every_xdist_worker(tmp_path: Path) -> None:
    """`python -m tests.pauses -n 2` stops the two worker processes that run the
    tests, not only the main pytest process, which runs none."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_probe.py").write_text(PROBE)
    pauses = [sys.executable, "-m", "tests.pauses", "--pause", "1", "--every", "0.2", "0.5"]
    pytest_args = ["-c", str(tmp_path / "pytest.ini"), "-p", "no:cacheprovider", "-n", "2", "-v"]
    done = subprocess.run(
        [*pauses, *pytest_args, str(tmp_path / "test_probe.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    passed = [line for line in done.stdout.splitlines() if "PASSED" in line]
    assert {line.split()[0] for line in passed} == {"[gw0]", "[gw1]"}, done.stdout


@pytest.mark.parametrize("ci", ["true", "1", None, "false"])
def test_a_missing_tool_skips_its_tests_here_and_fails_them_in_ci(
    ci: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python module, a program or a server the tests need and the machine
    lacks skips the tests that need it; under CI=true it fails them instead."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci in ("true", "1") else pytest.skip.Exception

    def no_server() -> PostgresServer:
        raise RuntimeError("no initdb")

    with pytest.raises(outcome, match="fastapi_jobs_absent"):
        module("fastapi_jobs_absent")
    with pytest.raises(outcome, match="fastapi-jobs-absent"):
        program("fastapi-jobs-absent", "no remedy", at="/nonexistent/fastapi-jobs-absent")
    with pytest.raises(outcome, match="no initdb"):
        next(serving(no_server, "PostgreSQL"))
    assert module("json").dumps([]) == "[]"


def test_every_skip_for_a_missing_tool_goes_through_one_place() -> None:
    """No test skips on a missing import by itself (pytest.importorskip) or decides
    by itself what CI does: tests/support/tools.py does both, so that CI fails."""
    tests = Path(__file__).parents[1]
    own = {tests / "support" / "tools.py", Path(__file__)}
    found = [
        f"{path.relative_to(tests)}: {needle}"
        for path in sorted(tests.rglob("*.py"))
        if path not in own
        for needle in ("importorskip", 'environ.get("CI")', "environ['CI']")
        if needle in path.read_text()
    ]
    assert found == []
