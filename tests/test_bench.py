"""The benchmark command runs (on a tiny N): it is no timing assertion, only a smoke test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .support.coverage import untraced
from .support.postgres import PostgresServer

ROOT = Path(__file__).resolve().parent.parent


def test_bench_command_runs_on_a_tiny_n(tmp_path: Path, postgres: PostgresServer) -> None:
    """`python -m bench --quick --claims --requests` writes a table with every implementation."""
    out = tmp_path / "BENCHMARKS.md"
    subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--claims", "--requests", "--out", str(out)],
        cwd=ROOT,
        env=untraced(os.environ),  # the bench measures CPU per tick; traced, it took 120 s
        check=True,
        timeout=300,
        capture_output=True,
    )
    text = out.read_text()
    for impl in ("minimal", "floor", "fastapi_jobs", "apscheduler", "repeat_every"):
        assert f"| {impl} | asyncio | 20 |" in text
    assert "| 20 / 20 |" in text  # every expected tick ran, for the floor at least
    [pairs] = [line for line in text.splitlines() if "most runs of one pair" in line]
    assert pairs.endswith(", 1 |")  # no (job, tick) ran twice across the 3 processes
    assert "claims asked / claim statements sent" in text
    assert "## Requests" in text
