"""Every complete Python block of the README runs as written; the others say on
their first line that they are fragments."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from fastapi_jobs import LeaseLostError, Scheduler

from .conftest import serve

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
COMPLETE = [block for block in BLOCKS if not block.startswith("# fragment")]


def test_the_readme_has_complete_blocks_and_marks_the_others() -> None:
    """The Usage, fencing and offset examples are complete; fragments say so."""
    assert len(COMPLETE) >= 3
    assert all(block.startswith("# fragment:") for block in BLOCKS if block not in COMPLETE)


@pytest.mark.parametrize("code", COMPLETE, ids=[f"block{k}" for k in range(len(COMPLETE))])
async def test_a_complete_readme_block_runs(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block runs in a fresh namespace (SQLite files in a temporary folder); its
    app serves /jobs behind its auth (or its metrics), and each of its jobs runs once."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("JOBS_TOKEN", "readme-token")
    namespace: dict[str, object] = {"__name__": "readme_block"}
    exec(compile(code, "README.md", "exec"), namespace)
    scheduler = namespace["scheduler"]
    assert isinstance(scheduler, Scheduler) and scheduler.jobs
    app = namespace.get("app")
    if isinstance(app, FastAPI):
        async with serve(app) as client:
            if "fastapi_jobs.metrics" in code:  # the metrics example: its jobs' figures there
                answer = await client.get("/metrics")
                assert answer.status_code == 200  # not a redirect to /metrics/
                scraped = answer.text
                for name in scheduler.jobs:
                    assert f'fastapi_jobs_interval_seconds{{job_name="{name}"}}' in scraped
            else:
                assert (await client.get("/jobs")).status_code == 401
                admin = {"Authorization": "Bearer readme-token"}
                listed = await client.get("/jobs", headers=admin)
                assert listed.status_code == 200
                assert [job["name"] for job in listed.json()] == list(scheduler.jobs)
            results = [await scheduler.run_now(name) for name in scheduler.jobs]
    else:
        async with scheduler.running():
            results = [await scheduler.run_now(name) for name in scheduler.jobs]
    for value in namespace.values():
        if isinstance(value, AsyncEngine):
            await value.dispose()  # a module-level engine is the app's to close
    for result in results:
        # A run by hand has no claim, so a write fenced by it is refused, as documented.
        assert result.ok or isinstance(result.error, LeaseLostError), result.error
