"""Scheduled jobs that start and stop with your FastAPI app.

Public modules beside this one: ``fastapi_jobs.stores`` (claims in the app's
database), ``fastapi_jobs.observers`` (run hooks), ``fastapi_jobs.testing``
(virtual time), ``fastapi_jobs.metrics`` (Prometheus), ``fastapi_jobs.tracing``
(OpenTelemetry).
"""

import warnings as _warnings
from typing import Any as _Any

from ._backfill.results import BackfillResult, BackfillTick
from ._clock import Clock, SystemClock
from ._context import JobContext
from ._control import TriggeredRun
from ._dynamic.bounds import ScheduleBounds
from ._dynamic.sets import AppliedSchedules, ScheduleSpec
from ._dynamic.stored import StoredSchedule
from ._errors import (
    ConfigurationError,
    FastAPIJobsError,
    JobNotFoundError,
    JobRunningError,
    LeaseLostError,
    NameTakenError,
    NotRunningError,
    RunReplacedError,
    ScheduleChangedError,
    StoreError,
    TickAheadError,
    TooManySchedulesError,
    UnconfirmedError,
)
from ._job import Job
from ._results import RunResult
from ._scheduler import Scheduler
from ._schedules import Cron, Every, Schedule
from ._status import (
    ClusterJobStatus,
    ClusterView,
    ErrorInfo,
    Health,
    InstanceStatus,
    JobStatus,
    Outcome,
    PauseState,
    RunRecord,
)

__all__ = [
    "AppliedSchedules",
    "BackfillResult",
    "BackfillTick",
    "Clock",
    "ClusterJobStatus",
    "ClusterView",
    "ConfigurationError",
    "Cron",
    "ErrorInfo",
    "Every",
    "FastAPIJobsError",
    "Health",
    "InstanceStatus",
    "Job",
    "JobContext",
    "JobNotFoundError",
    "JobRunningError",
    "JobStatus",
    "LeaseLostError",
    "NameTakenError",
    "NotRunningError",
    "Outcome",
    "PauseState",
    "RunRecord",
    "RunReplacedError",
    "RunResult",
    "Schedule",
    "ScheduleBounds",
    "ScheduleChangedError",
    "ScheduleSpec",
    "Scheduler",
    "StoreError",
    "StoredSchedule",
    "SystemClock",
    "TickAheadError",
    "TooManySchedulesError",
    "TriggeredRun",
    "UnconfirmedError",
]

# Shown as fastapi_jobs.Scheduler (in reprs, tracebacks, docs), not by the
# private module that defines it.
for _name in __all__:
    _member = globals()[_name]
    if isinstance(_member, type):
        _member.__module__ = __name__
del _name, _member

# Names that moved to the public module that holds their concern (issue 17); kept
# here for one release, with a warning that says where they went.
_MOVED = {
    "LoopClock": "fastapi_jobs.testing",
    "Observer": "fastapi_jobs.observers",
    "RunStarted": "fastapi_jobs.observers",
    "RunFinished": "fastapi_jobs.observers",
    "TickSkipped": "fastapi_jobs.observers",
    "LeaseLost": "fastapi_jobs.observers",
    "Store": "fastapi_jobs.stores",
    "Ended": "fastapi_jobs.stores",
    "Instance": "fastapi_jobs.stores",
}


def __getattr__(name: str) -> _Any:
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _warnings.warn(
        f"fastapi_jobs.{name} moved to {moved}: import it from there "
        f"(from {moved} import {name}); the old name goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    from importlib import import_module

    return getattr(import_module(moved), name)
