"""``fastapi-jobs list`` and ``fastapi-jobs schedules`` with the HTTP listings'
filters and pages (``--state``, ``--name``, ``--limit``, ``--after``), over
2,000 declared jobs and 5,000 schedules in a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fastapi_jobs._cli.main import main

from ..web.many import LEGACY, PAUSED, TENANTS, legacy, seed, tenant
from .test_cli_schedules import TARGET, cli

MANY = "tests.cli.many_jobs_app:app"


def listed(out: str) -> list[str]:
    """The names a listing printed (its lines that are not indented)."""
    return [line for line in out.splitlines() if line and not line.startswith(" ")]


def test_list_filters_by_name_and_state_and_pages(capsys: pytest.CaptureFixture[str]) -> None:
    """Declared jobs in the order declared; a page ends saying where the next starts."""
    assert main(["list", MANY, "-n", "1", "--name", "JOB-1", "--limit", "30"]) == 0
    out, err = capsys.readouterr()
    assert listed(out) == [f"job-{i:04d}" for i in range(1000, 1030)]
    assert "30 shown of 1000; the next page: --after job-1029" in err
    assert main(["list", MANY, "-n", "1", "--name", "job-1", "--after", "job-1029"]) == 0
    out, err = capsys.readouterr()
    assert listed(out) == [f"job-{i:04d}" for i in range(1030, 2000)]
    assert "970 shown of 970" not in err and "970 shown of 1000" in err

    assert main(["list", MANY, "-n", "1", "--state", "paused"]) == 0
    out, err = capsys.readouterr()
    assert listed(out) == [f"job-{i:04d}" for i in range(0, 2000, 10)]
    assert "200 shown of 200" in err and "next page" not in err
    assert main(["list", MANY, "-n", "1", "--state", "failing"]) == 0  # no store: none known
    assert listed(capsys.readouterr().out) == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--state", "left_alone"], "fastapi-jobs schedules TARGET --state left_alone"),
        (["--after", "no-such-job"], "--after 'no-such-job': no such name here"),
        (["--limit", "0"], "--limit: write a whole number from 1, or all"),
        (["--state", "broken"], "invalid choice"),
    ],
)
def test_bad_filters_exit_2_saying_what_to_write(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["list", MANY, *args])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    assert code == 2
    out, err = capsys.readouterr()
    assert said in err and listed(out) == []


def test_schedules_filter_count_and_page_from_the_store(tmp_path: Path) -> None:
    """By name, --after a name whether or not it is still there; left_alone:
    the schedules whose task this app lacks."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'many.sqlite3'}"
    anyio.run(seed, url)
    page = cli(url, "schedules", TARGET, "--name", "legacy-01", "--limit", "40")
    assert page.returncode == 0, page.stderr
    assert listed(page.stdout) == [legacy(i) for i in range(100, 140)]
    assert "40 shown of 100; the next page: --after legacy-0139" in page.stderr
    # The cursor is a place by name: the page after a name no schedule has.
    rest = cli(url, "schedules", TARGET, "--name", "legacy-01", "--after", "legacy-0139x")
    assert listed(rest.stdout) == [legacy(i) for i in range(140, 200)]

    alone = cli(url, "schedules", TARGET, "--state", "left_alone", "--limit", "all")
    assert listed(alone.stdout) == [legacy(i) for i in range(LEGACY)]
    assert f"{LEGACY} shown of {LEGACY}" in alone.stderr
    paused = cli(url, "schedules", TARGET, "--state", "paused", "--limit", "10")
    assert listed(paused.stdout) == [tenant(i) for i in range(10)]
    assert f"10 shown of {PAUSED}" in paused.stderr
    whole = cli(url, "schedules", TARGET)
    assert len(listed(whole.stdout)) == TENANTS + LEGACY and "shown of" not in whole.stderr
