"""Scheduled jobs that start and stop with your FastAPI app."""

from __future__ import annotations

from ._clock import Clock, LoopClock, SystemClock
from ._context import JobContext
from ._errors import ConfigurationError, FastAPIJobsError, JobNotFoundError, JobRunningError
from ._job import Job
from ._runner import RunResult
from ._scheduler import Scheduler
from ._schedules import Cron, Every, Schedule
from ._status import ErrorInfo, JobStatus, Outcome

__all__ = [
    "Clock",
    "ConfigurationError",
    "Cron",
    "ErrorInfo",
    "Every",
    "FastAPIJobsError",
    "Job",
    "JobContext",
    "JobNotFoundError",
    "JobRunningError",
    "JobStatus",
    "LoopClock",
    "Outcome",
    "RunResult",
    "Schedule",
    "Scheduler",
    "SystemClock",
]
