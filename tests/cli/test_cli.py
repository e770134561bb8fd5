"""The ``fastapi-jobs`` command in this process: ``next``, ``list`` without a
store, and what bad input gets (the runs against a store, in real processes,
are in test_cluster_operate)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from fastapi_jobs._cli.main import main

from ..conftest import claim1, release1
from ..stores.test_store import opened
from ..support.cluster import ROOT


def test_next_prints_the_next_run_times_in_the_zone_and_utc(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["next", "0 7 * * mon-fri", "--tz", "America/New_York", "-n", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "cron '0 7 * * mon-fri' America/New_York (At 07:00 on Monday through Friday)"
    times = lines[1:]
    assert len(times) == 4
    for line in times:
        local, utc = line.split("  (")
        assert local.endswith(("07:00:00 EST", "07:00:00 EDT"))
        assert utc.endswith(("12:00:00 UTC)", "11:00:00 UTC)"))
    stamps = [datetime.strptime(t.split("  (")[1], "%Y-%m-%d %H:%M:%S UTC)") for t in times]
    assert stamps == sorted(stamps) and stamps[0].replace(tzinfo=UTC) > datetime.now(UTC)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["next", "0 7 * * mom"], "invalid cron expression '0 7 * * mom'"),
        (["next", "@daily", "--tz", "Mars/Olympus"], "Mars/Olympus"),
        (["next", "@daily", "-n", "0"], "-n 0: must be from 1 to 1000"),
        (["list", "no_colon_here"], "is not MODULE:ATTR"),
        (["list", ".main:app"], "'.main': a relative name"),
        (["list", "../../etc:passwd"], "a relative name"),
        (["list", "tests.apps.plain_app:nope"], "has no attribute 'nope'"),
        (["list", "tests.apps.plain_app:ping"], "no Scheduler was found"),
        (["run", "tests.apps.plain_app:app", "<script>"], "no job named '<script>'"),
    ],
)
def test_bad_input_exits_2_saying_what_is_wrong(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert said in err
    assert out == ""  # refused before anything is printed


def test_list_finds_the_scheduler_from_the_app_and_shows_each_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["list", "tests.apps.plain_app:app", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok\n  every 0.2s\n  every process (no store); not paused\n  next: ")
    assert [line.split()[0] for line in out.splitlines() if not line.startswith(" ")] == [
        "ok",
        "boom",
        "slow",
    ]
    assert out.count("  next: ") == 6


def test_run_without_a_store_runs_the_job_once_and_exits_by_its_outcome() -> None:
    def run(job: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fastapi_jobs", "run", "tests.apps.plain_app:scheduler", job],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = run("ok")
    assert ok.returncode == 0, ok.stderr
    # The tick it ran, as the logs say ticks.
    assert re.search(r"job 'ok': tick \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ok in", ok.stderr)
    boom = run("boom")  # sys.exit(2) inside the job: its failure, exit 1
    assert boom.returncode == 1, boom.stderr
    assert "SystemExit" in boom.stderr


@pytest.mark.parametrize("command", [[], ["list"], ["next"], ["run"]])
def test_every_command_has_help_with_an_example(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    assert "example" in capsys.readouterr().out


def test_version_names_the_distribution_whose_name_is_not_the_imports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--version` says which distribution this is (not the `fastapi-jobs` of the
    package index, which ships a `fastapi_jobs` package too) and its version."""
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    said = capsys.readouterr().out.strip()
    assert (
        said
        == f"fastapi-jobs (distribution fastapi-scheduled-jobs) {version('fastapi-scheduled-jobs')}"
    )


def test_list_shows_each_jobs_times_in_its_own_zone_not_the_machines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cron job's next runs in its time zone (and UTC), an interval job's in UTC,
    whatever zone the machine is set to; a declared pause is listed as paused."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert main(["list", "tests.apps.cli_app:scheduler", "-n", "1"]) == 0
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    out = capsys.readouterr().out
    assert "waiting\n  every 1h\n  every process (no store); paused\n  next: " in out
    [morning] = [line for line in out.split("morning\n")[1].splitlines() if "next:" in line]
    assert " 07:00:00 E" in morning and " UTC)" in morning
    hourly = next(line for line in out.splitlines() if "next:" in line)
    assert hourly.endswith(":00:00 UTC") and "JST" not in out


def test_a_reader_that_stops_reading_ends_the_listing_quietly() -> None:
    """`fastapi-jobs list ... | head -1`: the pipe closes under the listing, which
    ends with 128 + SIGPIPE and no traceback (it once printed two, and blamed the
    job's schedule for the closed pipe)."""
    import signal

    listing = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fastapi_jobs",
            "list",
            "tests.apps.cli_app:scheduler",
            "-n",
            "1000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert listing.stdout is not None and listing.stderr is not None
    first = listing.stdout.readline()
    listing.stdout.close()  # what head does after its line
    with listing.stderr:
        said = listing.stderr.read().decode()
    assert listing.wait(timeout=60) == 128 + signal.SIGPIPE, said
    assert first.strip() and "Traceback" not in said and "its schedule fails" not in said


def test_list_shows_each_jobs_runs_on_every_instance_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command runs nothing itself: with a store, a job's line says how many
    times every instance ran it (the store's count of its claims) and how the
    last run ended; a job never claimed says nothing of runs."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'counted.sqlite3'}"

    async def seed() -> None:
        async with opened(url) as (store, _):
            for fence in range(1, 4):
                assert await claim1(store, "digest", 1000.0 + fence) == fence
                await release1(store, "digest", fence, "failed" if fence == 3 else "ok", None, 1)

    anyio.run(seed)
    (tmp_path / "counted_app.py").write_text(
        "from fastapi_jobs import Scheduler\n"
        "from fastapi_jobs.stores import SQLAlchemyStore\n"
        f"scheduler = Scheduler(store=SQLAlchemyStore({url!r}))\n"
        "@scheduler.every(hours=240)\n"
        "async def digest() -> None: ...\n"
        "@scheduler.every(hours=240)\n"
        "async def fresh() -> None: ...\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "counted_app", raising=False)
    assert main(["list", "counted_app:scheduler", "-n", "1"]) == 0
    digest, fresh = capsys.readouterr().out.split("fresh\n")
    assert re.search(
        r"\n  runs: 3 on all instances; the last: failed, \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\n",
        digest,
    ), digest
    assert "runs:" not in fresh
