"""``fastapi-jobs schedules`` and ``fastapi-jobs schedule add|change|remove`` in
real processes on a real SQLite store: what each prints, its exit code, and
that an app instance running beside runs what the command made."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastapi_jobs._cli.main import main
from fastapi_jobs.stores import Instance, SQLAlchemyStore

from ..support.cluster import ROOT, App
from ..support.waiting import wait_until

TARGET = "tests.apps.schedule_app:app"


def cli(
    url: str, *args: str, input: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastapi_jobs", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, **env},
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'schedules.sqlite3'}"


@pytest.mark.slow  # 9-16 s of processes: .ci/run's slow pass
def test_a_schedule_is_made_listed_changed_and_removed_from_the_command_line(url: str) -> None:
    made = cli(
        url,
        *("schedule", "add", TARGET, "acme-report", "report"),
        *("--cron", "0 7 * * *", "--tz", "Europe/Lisbon"),
        *("--kwargs", '{"tenant": "acme"}', "--option", "retries=2"),
    )
    assert made.returncode == 0, made.stderr
    shown = json.loads(made.stdout)
    assert shown["schedule"] == {"cron": "0 7 * * *", "tz": "Europe/Lisbon"}
    assert (shown["kwargs"], shown["options"], shown["known"]) == (
        {"tenant": "acme"},
        {"retries": 2},
        True,
    )

    changed = cli(url, "schedule", "change", TARGET, "acme-report", "--every", "3600")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["schedule"] == {"every": 3600.0, "offset": 0.0}
    assert json.loads(changed.stdout)["kwargs"] == {"tenant": "acme"}  # kept

    listed = cli(url, "schedules", TARGET)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == (
        'acme-report\n  task report\n  every 1h\n  kwargs {"tenant": "acme"}\n'
        '  options {"retries": 2}\n'
    )
    # An older release, without the task: it lists the schedule as unknown, and leaves it.
    old = cli(url, "schedules", TARGET, TASK="0")
    assert old.returncode == 0, old.stderr
    assert (
        "  task report: left alone here (it names the task 'report', which this instance "
        "lacks)\n" in old.stdout
    )

    removed = cli(url, "schedule", "remove", TARGET, "acme-report")
    assert removed.returncode == 0, removed.stderr
    assert "schedule 'acme-report' removed" in removed.stderr
    none = cli(url, "schedules", TARGET)
    assert none.stdout == "" and "no schedules made at run time" in none.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["add", "x", "nope", "--every", "60"], "no task named 'nope'"),
        (["add", "x", "report", "--every", "60"], "needs the argument(s) tenant"),
        (["add", "x", "report", "--cron", "0 7 * * mom"], "invalid cron expression"),
        (["add", "x", "report", "--cron", "@daily", "--tz", "Mars/X"], "unknown timezone"),
        (["add", "x", "report", "--every", "60", "--kwargs", "[1]"], "--kwargs is a JSON object"),
        (["add", "x", "report", "--every", "60", "--kwargs", "{"], "--kwargs is not JSON"),
        (["add", "a/b", "report", "--every", "60"], "no '/'"),
        (
            ["add", "declared", "report", "--every", "60", "--kwargs", '{"tenant": "a"}'],
            "a declared job has that name",
        ),
        (
            [
                "add",
                "x",
                "report",
                "--every",
                "60",
                "--kwargs",
                '{"tenant": "a"}',
                "--option",
                "colour=red",
            ],
            "'colour' is not an option",
        ),
        (["add", "x", "report", "--every", "60", "--option", "retries"], "write KEY=VALUE"),
        (["change", "nope", "--every", "60"], "no schedule named 'nope'"),
        (["change", "x", "--tz", "Europe/Lisbon"], "--tz with --cron"),
        (["remove", "nope"], "no schedule named 'nope'"),
    ],
)
def test_bad_input_exits_2_saying_what_is_wrong(
    argv: list[str],
    said: str,
    url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    assert main(["schedule", argv[0], TARGET, *argv[1:]]) == 2
    out, err = capsys.readouterr()
    assert said in err
    assert out == ""


def test_a_taken_name_exits_2(url: str) -> None:
    args = (
        "schedule",
        "add",
        TARGET,
        "t",
        "report",
        "--every",
        "60",
        "--kwargs",
        '{"tenant": "a"}',
    )
    assert cli(url, *args).returncode == 0
    again = cli(url, *args)
    assert again.returncode == 2
    assert "a schedule named 't' exists: change it instead" in again.stderr


def test_a_store_that_cannot_be_reached_exits_1(tmp_path: Path) -> None:
    """No directory for the SQLite file: nothing can be read nor made."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'no' / 'such' / 'dir.sqlite3'}"
    listed = cli(url, "schedules", TARGET)
    assert listed.returncode == 1, listed.stderr
    made = cli(
        url,
        "schedule",
        "add",
        TARGET,
        "t",
        "report",
        "--every",
        "60",
        "--kwargs",
        '{"tenant": "a"}',
    )
    assert made.returncode == 1, made.stderr
    assert "nothing changed" in made.stderr and "Traceback" not in made.stderr


def test_without_a_store_a_change_is_refused_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["schedule", "add", "tests.apps.plain_app:app", "t", "report", "--every", "60"]) == 2
    )
    assert "has no store" in capsys.readouterr().err


def test_a_running_app_runs_what_the_command_made(
    url: str, tmp_path: Path, apps: list[App]
) -> None:
    """The app instance follows the store within a heartbeat: it runs the
    schedule the command made, with its arguments, and stops once removed."""
    ran = tmp_path / "ran.txt"
    app = App(url, app=TARGET, RAN_FILE=str(ran))
    apps.append(app)
    app.wait_started()
    made = cli(
        url,
        "schedule",
        "add",
        TARGET,
        "fast",
        "report",
        "--every",
        "0.5",
        "--kwargs",
        '{"tenant": "cli"}',
    )
    assert made.returncode == 0, made.stderr
    wait_until(lambda: ran.exists() and len(ran.read_text().splitlines()) >= 2, timeout=30)
    assert {line.split()[0] for line in ran.read_text().splitlines()} == {"cli"}
    assert cli(url, "schedule", "remove", TARGET, "fast").returncode == 0


def test_a_listing_read_by_head_exits_as_list_does(url: str) -> None:
    """`fastapi-jobs schedules ... | head -c 1`: the reader closed the pipe; the exit
    is 141 (SIGPIPE's), as `list`'s, never 'the store could not be reached'."""
    made = cli(
        url,
        "schedule",
        "add",
        TARGET,
        "s0",
        "report",
        "--every",
        "60",
        "--kwargs",
        json.dumps({"tenant": "x"}),
    )
    assert made.returncode == 0, made.stderr

    async def more() -> None:  # 200 KB of listing: more than a pipe holds
        store = SQLAlchemyStore(url)
        await store.open({}, Instance())
        try:
            for n in range(1, 70):
                kwargs = json.dumps({"tenant": "x" * 3000})
                spec = (
                    f'{{"kwargs":{kwargs},"options":{{}},"schedule":{{"every":60.0,"offset":0.0}}}}'
                )
                await store.schedules.create(f"s{n}", "report", spec)
        finally:
            await store.close()

    asyncio.run(more())
    shell = f"{sys.executable} -m fastapi_jobs schedules {TARGET} | head -c 1 > /dev/null"
    piped = subprocess.run(
        ["bash", "-o", "pipefail", "-c", shell],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "could not be reached" not in piped.stderr, piped.stderr
    assert piped.returncode == 141, (piped.returncode, piped.stderr)
