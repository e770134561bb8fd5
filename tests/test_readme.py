"""Every complete Python block of the README runs as written; the others say on
their first line that they are fragments."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from fastapi_jobs import ClusterJobStatus, JobStatus, LeaseLostError, Scheduler

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
                refused = await client.get("/jobs/ui")
                assert refused.status_code == 401
                # A browser asks for a password: its Basic login opens the page too.
                assert refused.headers["www-authenticate"].startswith("Basic")
                page = await client.get("/jobs/ui", auth=("admin", "readme-token"))
                assert page.status_code == 200
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


ROOT = Path(__file__).resolve().parent.parent
INSTALL = re.compile(r"pip install ((?:(?:-e|--\S+) )*)('[^']*'|\S+)")


def installs() -> list[tuple[str, str]]:
    """Every `pip install` the README and the library's messages tell users to run:
    (where, what it installs)."""
    found = [("README.md", m.group(2)) for m in INSTALL.finditer(README)]
    for path in sorted((ROOT / "fastapi_jobs").rglob("*.py")):
        text = path.read_text()
        found += [(path.name, m.group(2)) for m in INSTALL.finditer(text)]
    return found


def test_every_install_command_installs_this_project() -> None:
    """`pip install 'fastapi-jobs[...]'` installed another project of that name
    from the package index: every install command shown installs this one (from
    its clone), with extras it has."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        extras = set(tomllib.load(file)["project"]["optional-dependencies"])
    commands = installs()
    assert len(commands) >= 6
    for where, target in commands:
        found = re.match(r"['\"]?([^'\"`\s,;)]+)", target)
        assert found is not None, f"{where}: pip install {target}"
        plain = found.group(1)
        path, _, wanted = plain.partition("[")
        assert path in (".", "./"), f"{where}: pip install {target} is not this project"
        for extra in filter(None, wanted.rstrip("]").split(",")):
            assert extra in extras, f"{where}: pip install {target}: no extra {extra!r}"


def test_the_status_example_has_every_field_the_api_answers() -> None:
    """The README's `GET /jobs` example shows each field of JobStatus and of its
    `cluster`, no more, no less (it once lacked four that had landed)."""
    example = json.loads(re.findall(r"```json\n(.*?)```", README, re.DOTALL)[0])
    assert set(example) == set(JobStatus.model_fields)
    assert set(example["cluster"]) == set(ClusterJobStatus.model_fields)
    JobStatus.model_validate(example)  # and each value has the right shape
