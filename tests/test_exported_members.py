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
    }
    public = {name for name in vars(fastapi_jobs) if not name.startswith("_")}
    assert public - {"stores"} == set(fastapi_jobs.__all__)  # nothing else leaks
    for name in fastapi_jobs.__all__:
        member = getattr(fastapi_jobs, name)
        if name == "Outcome":  # a Literal alias: it has no module of its own
            continue
        assert member.__module__.startswith("fastapi_jobs._"), name


def test_stores_module_exports() -> None:
    """fastapi_jobs.stores is a public module of its own, imported only when used."""
    import fastapi_jobs.stores

    assert fastapi_jobs.stores.__all__ == ["SQLAlchemyStore"]
