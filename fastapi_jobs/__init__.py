"""Scheduled jobs that start and stop with your FastAPI app."""

from ._clock import Clock, LoopClock, SystemClock
from ._context import JobContext
from ._control import TriggeredRun
from ._errors import (
    ConfigurationError,
    FastAPIJobsError,
    JobNotFoundError,
    JobRunningError,
    LeaseLostError,
    NotRunningError,
    StoreError,
    UnconfirmedError,
)
from ._job import Job
from ._observe import LeaseLost, Observer, RunFinished, RunStarted, TickSkipped
from ._runner import RunResult
from ._scheduler import Scheduler
from ._schedules import Cron, Every, Schedule
from ._status import (
    ClusterJobStatus,
    ClusterView,
    ErrorInfo,
    InstanceStatus,
    JobStatus,
    Outcome,
    PauseState,
    RunRecord,
)
from ._store import Ended, Instance, Store

__all__ = [
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
]
