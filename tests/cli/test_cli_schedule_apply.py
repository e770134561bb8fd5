"""``fastapi-jobs schedule apply --group G FILE``: a group's schedules made
exactly those of a JSON file, in real processes on a real SQLite store; what a
bad file gets (exit 2, saying where)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fastapi_jobs._cli.main import main

from .test_cli_schedules import TARGET, cli


def tenants(names: list[str], every: int = 3600) -> dict[str, Any]:
    return {
        "schedules": [
            {
                "name": f"r-{t}",
                "task": "report",
                "schedule": {"every": every},
                "kwargs": {"tenant": t},
            }
            for t in names
        ]
    }


@pytest.mark.slow  # processes: .ci/run's slow pass
def test_a_file_of_thousands_is_applied_then_again_untouched_then_trimmed(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'schedules.sqlite3'}"
    names = [f"t{n:04}" for n in range(3_000)]
    file = tmp_path / "set.json"
    file.write_text(json.dumps(tenants(names)))
    made = cli(url, "schedule", "apply", TARGET, "--group", "reports", str(file))
    assert made.returncode == 0, made.stderr
    assert len(json.loads(made.stdout)["created"]) == 3_000
    again = cli(url, "schedule", "apply", TARGET, "--group", "reports", str(file))
    assert json.loads(again.stdout)["unchanged"] == 3_000
    file.write_text(json.dumps(tenants(names[:10], every=60)))
    trimmed = json.loads(
        cli(
            url, "schedule", "apply", TARGET, "--group", "reports", "-", input=file.read_text()
        ).stdout
    )
    assert (len(trimmed["changed"]), len(trimmed["removed"])) == (10, 2_990)
    listed = cli(url, "schedules", TARGET)
    assert listed.stdout.count("\n  task report") == 10
    taken = cli(url, "schedule", "apply", TARGET, "--group", "other", str(file))
    assert taken.returncode == 2 and "'r-t0000'" in taken.stderr
    assert "nothing was applied" in taken.stderr


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{", "is not JSON"),
        ("[]", 'write {"schedules": [...]}'),
        ('{"schedules": [], "x": 1}', 'write {"schedules": [...]}'),  # as PUT refuses it
        ('{"schedules": [1]}', "schedules[0]: 1 is not a schedule"),
        ('{"schedules": [{"name": "a", "task": "t"}]}', "schedules[0]: a schedule has the keys"),
        (
            '{"schedules": [{"name": "a", "task": "t", "schedule": {"every": 60}, "x": 1}]}',
            "(not 'x')",
        ),
        ('{"schedules": [{"name": "a", "task": "t", "schedule": {"hourly": 1}}]}', "schedule"),
        (
            '{"schedules": [{"name": "a", "task": "t", "schedule": {"every": 60}, "options": 3}]}',
            "options 3: write a JSON object",
        ),
    ],
)
def test_a_bad_file_exits_2_saying_where(
    content: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "set.json"
    file.write_text(content)
    assert main(["schedule", "apply", TARGET, "--group", "g", str(file)]) == 2
    out, err = capsys.readouterr()
    assert said in err and out == ""


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "apply", TARGET, "--group", "g", str(tmp_path / "nope")]) == 2
    assert "cannot read" in capsys.readouterr().err
