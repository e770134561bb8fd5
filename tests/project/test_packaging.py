"""What the distribution says of itself matches what CI tests and ships."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_the_classifiers_name_every_python_ci_tests() -> None:
    """requires-python's floor and each newer Python `.ci/run` tests are listed,
    and no Python that CI does not test."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = re.fullmatch(r">=(3\.\d+)", project["requires-python"])
    assert floor is not None
    looped = re.search(r"^for version in ([\d. ]+); do$", (ROOT / ".ci/run").read_text(), re.M)
    assert looped is not None
    tested = {floor.group(1), *looped.group(1).split()}
    listed = {
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert listed == tested


def test_the_license_is_the_whole_mit_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) ")
    assert "Permission is hereby granted, free of charge" in text
    assert text.rstrip().endswith("OTHER DEALINGS IN THE\nSOFTWARE.")


def test_the_distribution_is_named_once_and_its_version_read_from_it() -> None:
    """pyproject's name is the one the library tells users to install and reads its
    version from (the span's instrumentation version), and the example extra
    installs this distribution's own extras, not the other project's."""
    from importlib.metadata import version

    from fastapi_jobs._distribution import NAME

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == NAME == "fastapi-scheduled-jobs"
    assert version(NAME) == project["version"]
    (example,) = (dep for dep in project["optional-dependencies"]["example"] if "[" in dep)
    assert example.startswith(f"{NAME}[")


@pytest.mark.parametrize(
    ("blocked", "statement", "extra", "said"),
    [
        (
            "sqlalchemy",
            "from fastapi_jobs.stores import SQLAlchemyStore",
            "sqlite",
            (
                "SQLAlchemyStore needs SQLAlchemy and a driver",
                "extra [sqlite] (aiosqlite), [postgres] (asyncpg) or [psycopg]",
            ),
        ),
        (
            "sqlalchemy",
            "from fastapi_jobs.stores import include_tables",
            "sqlalchemy",
            ("include_tables needs SQLAlchemy (no driver)",),  # the store needs one
        ),
        (
            "prometheus_client",
            "import fastapi_jobs.metrics",
            "prometheus",
            ("fastapi_jobs.metrics needs prometheus_client",),
        ),
        (
            "opentelemetry",
            "import fastapi_jobs.tracing",
            "otel",
            ("fastapi_jobs.tracing needs the OpenTelemetry API",),
        ),
        ("arq", "import fastapi_jobs.queues.arq", "arq", ("fastapi_jobs.queues.arq needs arq",)),
        (
            "celery",
            "import fastapi_jobs.queues.celery",
            "celery",
            ("fastapi_jobs.queues.celery needs Celery",),
        ),
        (
            "procrastinate",
            "import fastapi_jobs.queues.procrastinate",
            "procrastinate",
            ("fastapi_jobs.queues.procrastinate needs procrastinate",),
        ),
    ],
)
def test_a_missing_extra_names_this_distributions_extra(
    blocked: str, statement: str, extra: str, said: tuple[str, ...]
) -> None:
    """Without the extra's library, the import says which extra of *this*
    distribution to install (`fastapi-jobs` on the index is another project),
    and what needs it; the core, the store protocol and the hand-off seam import
    without any of them."""
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "import fastapi_jobs\n"
        "from fastapi_jobs.stores import Ended, Instance, Store\n"
        "from fastapi_jobs.queues import Handoff\n"
        "try:\n"
        f"    {statement}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    sys.exit('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, *more = said  # what needs what, first; then anything else it must say
    assert out.stdout.startswith(first), out.stdout
    assert all(part in out.stdout for part in more), out.stdout
    assert f"pip install 'fastapi-scheduled-jobs[{extra}]'" in out.stdout
    assert f"pip install '.[{extra}]'" in out.stdout  # from a clone, before it is published
