"""The public API is exactly what is meant to be exported."""

from __future__ import annotations

import importlib

import pytest

import fastapi_jobs


def test_exported_members() -> None:
    """Everything in __all__ is defined and public, nothing else is, and each
    shows as the package's own (``fastapi_jobs.Scheduler``), not as the private
    module that defines it."""
    assert fastapi_jobs.__all__ == sorted(fastapi_jobs.__all__)
    assert set(fastapi_jobs.__all__) == {
        "AppliedSchedules",
        "BackfillResult",
        "BackfillTick",
        "Clock",
        "ClusterJobStatus",
        "ClusterView",
        "ConfigurationError",
        "Cron",
        "ErrorInfo",
        "Health",
        "ScheduleChangedError",
        "Every",
        "FastAPIJobsError",
        "InstanceStatus",
        "Job",
        "JobContext",
        "JobNotFoundError",
        "JobRunningError",
        "JobStatus",
        "LeaseLostError",
        "NameTakenError",
        "RunReplacedError",
        "NotRunningError",
        "Outcome",
        "PauseState",
        "RunRecord",
        "RunResult",
        "Schedule",
        "ScheduleBounds",
        "ScheduleSpec",
        "Scheduler",
        "StoreError",
        "StoredSchedule",
        "SystemClock",
        "TickAheadError",
        "TooManySchedulesError",
        "TriggeredRun",
        "UnconfirmedError",
    }
    public = {name for name in vars(fastapi_jobs) if not name.startswith("_")}
    # Public submodules show as attributes once imported (by another test).
    submodules = {"stores", "metrics", "tracing", "observers", "testing", "queues"}
    assert public - submodules == set(fastapi_jobs.__all__)
    for name in fastapi_jobs.__all__:
        if name == "Outcome":  # a Literal alias: it has no module of its own
            continue
        assert getattr(fastapi_jobs, name).__module__ == "fastapi_jobs", name


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "fastapi_jobs.stores",
            ["Ended", "Instance", "SQLAlchemyStore", "Store", "include_tables"],
        ),
        (
            "fastapi_jobs.observers",
            ["LeaseLost", "Observer", "RunFinished", "RunStarted", "TickSkipped"],
        ),
        ("fastapi_jobs.testing", ["LoopClock", "MemoryDatabase", "MemoryStore", "virtual"]),
        ("fastapi_jobs.queues", ["Handoff", "HandoffRequest", "Outbox", "handoff_key"]),
        ("fastapi_jobs.queues.arq", ["ArqTask"]),
        ("fastapi_jobs.queues.celery", ["CeleryTask"]),
        ("fastapi_jobs.queues.procrastinate", ["ProcrastinateTask"]),
    ],
)
def test_each_public_module_exports_its_own(module: str, names: list[str]) -> None:
    """A concern's public module: its __all__, each name shown as that module's."""
    imported = importlib.import_module(module)
    assert imported.__all__ == names
    for name in names:
        assert getattr(imported, name).__module__ == module, name


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("LoopClock", "fastapi_jobs.testing"),
        ("Observer", "fastapi_jobs.observers"),
        ("RunFinished", "fastapi_jobs.observers"),
        ("Store", "fastapi_jobs.stores"),
        ("Ended", "fastapi_jobs.stores"),
        ("Instance", "fastapi_jobs.stores"),
    ],
)
def test_a_moved_name_still_imports_with_a_warning_saying_where(name: str, module: str) -> None:
    """The names that moved to their concern's module are kept for one release:
    importing them from the package warns, naming the new place."""
    with pytest.warns(DeprecationWarning, match=f"moved to {module}: import it from there"):
        old = getattr(fastapi_jobs, name)
    assert old is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        fastapi_jobs.Nope  # noqa: B018


def test_the_operators_modules_are_optional_and_imported_only_when_used() -> None:
    """prometheus_client and OpenTelemetry are extras: the core never imports them."""
    import subprocess
    import sys

    code = (
        "import sys, fastapi_jobs, fastapi_jobs.stores\n"
        "assert 'prometheus_client' not in sys.modules\n"
        "assert not any(m.startswith('opentelemetry') for m in sys.modules)\n"
        "assert 'arq' not in sys.modules and 'redis' not in sys.modules\n"
        "assert 'celery' not in sys.modules and 'kombu' not in sys.modules\n"
        "import fastapi_jobs.metrics, fastapi_jobs.tracing\n"
        "assert fastapi_jobs.metrics.__all__ == ['DURATION_BUCKETS', 'LATENESS_BUCKETS', "
        "'PER_JOB_LIMIT', 'Metrics', 'instrument']\n"
        "assert fastapi_jobs.tracing.__all__ == ['Tracing', 'instrument']\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
