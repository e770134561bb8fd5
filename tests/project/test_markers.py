"""The markers .ci/run selects the newer Pythons' tests by are set by the fixtures
a test uses (tests/conftest.py), not by its file or its name."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ..support.cluster import ROOT


def newer_pythons_selection() -> str:
    """The marker expression .ci/run gives pytest on Python 3.12 and 3.13."""
    found = re.search(r"^newer_tests='([^']+)'$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert found, ".ci/run has no newer_tests='...' marker expression"
    return found.group(1)


def collected(*args: str) -> set[str]:
    """The ids pytest collects from the suite with ``args``."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {line for line in done.stdout.splitlines() if "::" in line}


@pytest.mark.slow  # 9-16 s of processes: .ci/run's slow pass
def test_the_newer_pythons_run_no_test_that_needs_postgresql_processes_or_a_browser() -> None:
    """A test that uses the postgres fixture (whatever its name), database_url or
    cluster_url on PostgreSQL, the apps processes or the browser is left out of the
    newer Pythons' run; the same tests on SQLite are in it."""
    selected = collected("-m", newer_pythons_selection())
    # Takes the postgres fixture itself: a -k filter on driver names let it through.
    assert (
        "tests/core/test_outages.py::test_a_release_the_database_missed_is_sent_again_when_it_is_back"
        not in selected
    )
    assert not [
        test for test in selected if re.search(r"[\[-](asyncpg|psycopg|postgresql)[\]-]", test)
    ]
    assert (
        "tests/core/test_claims.py::test_each_tick_runs_once_across_instances[sqlite]" in selected
    )
    # The apps fixture (uvicorn processes), on SQLite too; the browser fixture.
    apps_on_sqlite = (
        "tests/cluster/test_cluster_operate.py::"
        "test_a_pause_through_a_shared_port_stops_every_worker"
    )
    assert apps_on_sqlite not in selected
    assert not [test for test in selected if test.startswith("tests/web/test_page_browser.py::")]
    assert "tests/core/test_schedules.py" in {test.split("::")[0] for test in selected}
