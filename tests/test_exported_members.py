"""The public API is exactly what is meant to be exported."""

from __future__ import annotations

import fastapi_jobs


def test_exported_members() -> None:
    """Everything in __all__ is defined, public, and nothing private leaks."""
    assert fastapi_jobs.__all__ == sorted(fastapi_jobs.__all__)
    assert set(fastapi_jobs.__all__) == {
        "Clock",
        "ClusterJobStatus",
        "ClusterView",
        "ConfigurationError",
        "Cron",
        "Ended",
        "ErrorInfo",
        "Every",
        "FastAPIJobsError",
        "Instance",
        "InstanceStatus",
        "Job",
        "JobContext",
        "JobNotFoundError",
        "JobRunningError",
        "JobStatus",
        "LeaseLost",
        "LeaseLostError",
        "LoopClock",
        "NotRunningError",
        "Observer",
        "Outcome",
        "PauseState",
        "RunFinished",
        "RunRecord",
        "RunResult",
        "RunStarted",
        "Schedule",
        "Scheduler",
        "Store",
        "StoreError",
        "SystemClock",
        "TickSkipped",
        "TriggeredRun",
        "UnconfirmedError",
    }
    public = {name for name in vars(fastapi_jobs) if not name.startswith("_")}
    # Public submodules show as attributes once imported (by another test).
    assert public - {"stores", "metrics", "tracing"} == set(fastapi_jobs.__all__)
    for name in fastapi_jobs.__all__:
        member = getattr(fastapi_jobs, name)
        if name == "Outcome":  # a Literal alias: it has no module of its own
            continue
        assert member.__module__.startswith("fastapi_jobs._"), name


def test_stores_module_exports() -> None:
    """fastapi_jobs.stores is a public module of its own, imported only when used."""
    import fastapi_jobs.stores

    assert fastapi_jobs.stores.__all__ == ["SQLAlchemyStore"]


def test_the_operators_modules_are_optional_and_imported_only_when_used() -> None:
    """prometheus_client and OpenTelemetry are extras: the core never imports them."""
    import subprocess
    import sys

    code = (
        "import sys, fastapi_jobs, fastapi_jobs.stores\n"
        "assert 'prometheus_client' not in sys.modules\n"
        "assert not any(m.startswith('opentelemetry') for m in sys.modules)\n"
        "import fastapi_jobs.metrics, fastapi_jobs.tracing\n"
        "assert fastapi_jobs.metrics.__all__ == ['DURATION_BUCKETS', 'LATENESS_BUCKETS', "
        "'Metrics', 'instrument']\n"
        "assert fastapi_jobs.tracing.__all__ == ['Tracing', 'instrument']\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
