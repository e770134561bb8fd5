"""The benchmark command runs (on a tiny N): it is no timing assertion, only a smoke test.
What it writes with ``--out`` is the generated tables alone, in BENCHMARKS.md's shape, and
it never overwrites a file it did not write."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import MARKER, write_out

from ..support.coverage import untraced
from ..support.postgres import PostgresServer
from ..support.redis import RedisServer

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "BENCHMARKS.md"
NOTES = "# Notes written by hand\n\nA side-by-side run that no bench can measure again.\n"


def skeleton(text: str) -> list[str]:
    """What a run writes whatever its figures: headings (numbers masked), the section
    markers, the reproduce line, each table's header, and the claims table's row names."""
    lines = text.splitlines()
    kept: list[str] = []
    header = ""
    for k, line in enumerate(lines[1:], start=1):  # line 0, the marker, names the command
        if line.startswith(("#", "<!--", "Reproduce:", "(The whole run took")):
            kept.append(re.sub(r"\d[\d,]*", "N", line))
        elif k + 1 < len(lines) and lines[k + 1].startswith("|---"):
            header = line
            kept.append(line)
        elif header == "| figure | value |" and line.startswith("| "):
            kept.append(line.rsplit(" | ", 1)[0])
    return kept


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        env=untraced(os.environ),  # the bench measures CPU per tick; traced, it took 120 s
        timeout=300,
        capture_output=True,
        text=True,
    )


@pytest.mark.timeout(300)  # ~110 s on a quiet machine (the schedules' run ~25 s of it)
@pytest.mark.slow  # minutes of real processes: CI's second run (pytest -m slow)
def test_bench_command_runs_on_a_tiny_n(
    tmp_path: Path, postgres: PostgresServer, redis: RedisServer
) -> None:
    """`python -m bench --quick --claims --requests --handoffs --schedules --out`
    overwrites a file it wrote (BENCHMARKS.md) with the tables alone, in
    BENCHMARKS.md's shape (the hand-offs' rows, each library's call beside its
    adapter's, and the stored schedules' section included), every implementation in
    them. (The bench starts servers of its own; the fixtures make CI fail where none
    can start.)"""
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(BENCHMARKS.read_text())
    flags = ["--quick", "--claims", "--requests", "--handoffs", "--schedules"]
    done = bench(*flags, "--out", str(out))
    done.check_returncode()
    text = out.read_text()
    assert text.startswith(f"{MARKER} {' '.join(flags)} --out {out}` ")
    assert "INFO" not in text  # the schedulers' and stores' logs kept out of the tables
    assert skeleton(text) == skeleton(BENCHMARKS.read_text())
    assert BENCHMARKS.read_text().startswith(MARKER)
    for impl in ("minimal", "floor", "fastapi_jobs", "apscheduler", "repeat_every"):
        assert f"| {impl} | asyncio | 20 |" in text
    assert "| 20 / 20 |" in text  # every expected tick ran, for the floor at least
    [pairs] = [line for line in text.splitlines() if "most runs of one pair" in line]
    # No (job, tick) ran twice across the 3 processes (and some ran: the log says why not).
    assert pairs.endswith(", 1 |"), done.stderr[-4000:]
    [scheduled] = [line for line in text.splitlines() if "pairs run in the window" in line]
    assert scheduled.endswith("| 50, 1 | 50, 1 | |")  # each tick once, stored and declared


@pytest.mark.timeout(180)  # ~25 s on a quiet machine: a period of 4 s, waited for thrice
@pytest.mark.slow  # a PostgreSQL server and 4 processes of its own: CI's second run
def test_the_many_schedules_bench_runs_each_due_tick_once(postgres: PostgresServer) -> None:
    """`python -m bench.many_schedules report --quick` prints its section: every
    stored schedule a job once started, each figure a number, and across the 3
    processes every due tick of the period run, none twice."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.many_schedules", "report", "--quick"],
        cwd=ROOT,
        env=untraced(os.environ),
        timeout=170,
        capture_output=True,
        text=True,
    )
    done.check_returncode()
    lines = done.stdout.splitlines()
    assert lines[0].startswith("## 200 stored schedules on one instance")
    rows = {row.split(" | ")[0]: row.split(" | ")[1] for row in lines if row.startswith("| ")}
    assert rows["| jobs once started"] == "200"
    [once] = [measured for name, measured in rows.items() if "ticks of one period run" in name]
    assert once == "100; 1", done.stderr[-4000:]  # 100 due, each run once
    for name, measured in rows.items():
        if name not in ("| figure", "|---"):
            numbers = re.findall(r"-?\d+(?:\.\d+)?", measured)
            assert numbers and all(float(x) >= 0 for x in numbers), (name, measured)


@pytest.mark.slow  # a PostgreSQL server of its own: CI's second run
def test_the_claim_layers_bench_prints_each_layer(postgres: PostgresServer) -> None:
    """`python -m bench.claim_layers --quick` prints one row per layer, every call
    answered with all its rows (the script asserts it), each figure a number."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.claim_layers", "--quick"],
        cwd=ROOT,
        env=untraced(os.environ),
        timeout=120,
        capture_output=True,
        text=True,
    )
    done.check_returncode()
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0] for row in rows] == [
        "| store.claim",
        "| exec_driver_sql, connection held",
        "| asyncpg prepared statement",
        "| the rows' JSON encoding alone",
    ]
    for row in rows:
        one, many, per_row = (float(cell) for cell in row.strip("| ").split(" | ")[1:])
        # The per-row figure is a difference of two timings: in --quick's few
        # rounds, noise can make it negative (CI saw -0.51 µs). The timings can't be.
        assert one > 0 and many > 0 and abs(per_row) < many, row


def test_bench_refuses_to_overwrite_a_file_it_did_not_write(tmp_path: Path) -> None:
    """`--out` onto a file without the generated marker exits before measuring anything,
    says what to do, and leaves the file as it was."""
    notes = tmp_path / "notes.md"
    notes.write_text(NOTES)
    refused = bench("--quick", "--out", str(notes))
    assert refused.returncode != 0
    assert "refusing to overwrite" in refused.stderr
    assert "Give --out a new file" in refused.stderr
    assert refused.stdout == ""  # nothing measured: no implementation's figures printed
    assert notes.read_text() == NOTES


def test_the_write_checks_the_file_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file replaced by notes while the bench ran is not overwritten either, and the
    run's tables are printed instead of lost."""
    notes = tmp_path / "BENCHMARKS.md"
    notes.write_text(NOTES)
    with pytest.raises(SystemExit, match="refusing to overwrite"):
        write_out(notes, "# Benchmarks\n")
    assert notes.read_text() == NOTES
    assert "# Benchmarks" in capsys.readouterr().out
    fresh = tmp_path / "fresh.md"
    write_out(fresh, "the tables")
    assert fresh.read_text() == "the tables"


@pytest.mark.parametrize("where", ["missing-folder/BENCHMARKS.md", ".", "binary.md"])
def test_an_out_that_cannot_be_the_file_is_refused_before_measuring(
    where: str, tmp_path: Path
) -> None:
    """A folder that does not exist (the tables would be lost after minutes of
    measuring), a folder, or a binary file: refused up front, with a sentence,
    not a traceback."""
    (tmp_path / "binary.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    refused = bench("--quick", "--out", str(tmp_path / where))
    assert refused.returncode != 0
    assert (
        refused.stderr.startswith("python -m bench: --out ") and "Traceback" not in refused.stderr
    )
    assert refused.stdout == ""
    assert (tmp_path / "binary.md").read_bytes() == b"\x89PNG\r\n\x1a\n\x00\xff"
