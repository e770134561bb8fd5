"""The routers: read-only JSON views of the jobs (``router``), and the control
endpoints (``control_router``), which the app must put behind its own auth."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import anyio
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ._control import MAX_RUNS
from ._errors import (
    ConfigurationError,
    JobNotFoundError,
    JobRunningError,
    NotRunningError,
    StoreError,
)
from ._status import ErrorInfo, InstanceStatus, JobStatus, Outcome, PauseState, RunRecord

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ["build_control_router", "build_router"]

# POST /jobs/{name}/run?wait=true waits this long by default, at most _MAX_WAIT.
_WAIT = 30.0
_MAX_WAIT = 300.0

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No job has this name."}}
_NO_STORE: dict[int | str, dict[str, Any]] = {
    503: {"description": "The store cannot be reached, or the app is stopping: nothing changed."}
}


def _fail(exc: Exception) -> NoReturn:
    """The HTTP answer of an operation's error."""
    if isinstance(exc, JobNotFoundError):
        raise HTTPException(404, str(exc)) from None
    if isinstance(exc, JobRunningError):
        raise HTTPException(
            409,
            {
                "message": str(exc),
                "started_at": None if exc.started_at is None else exc.started_at.isoformat(),
                "instance": exc.instance,
            },
        ) from None
    if isinstance(exc, ConfigurationError):
        raise HTTPException(422, str(exc)) from None
    if isinstance(exc, (StoreError, NotRunningError)):
        raise HTTPException(503, str(exc)) from None
    raise exc


def build_router(scheduler: Scheduler) -> APIRouter:
    router = APIRouter(prefix="/jobs", tags=["jobs"])

    @router.get("", response_model=list[JobStatus], summary="Status of every job")
    async def list_jobs() -> list[JobStatus]:
        return await scheduler.cluster_status()

    @router.get(
        "/instances",
        response_model=list[InstanceStatus],
        summary="App instances sharing the store, seen recently",
    )
    async def list_instances() -> list[InstanceStatus]:
        view = await scheduler.cluster()
        return [] if view is None else view.instances

    @router.get(
        "/{name}",
        response_model=JobStatus,
        summary="Status of one job",
        responses=_NOT_FOUND,
    )
    async def get_job(name: str) -> JobStatus:
        if name not in scheduler.jobs:
            _fail(JobNotFoundError(name, list(scheduler.jobs)))
        return next(s for s in await scheduler.cluster_status() if s.name == name)

    @router.get(
        "/{name}/runs",
        response_model=list[RunRecord],
        summary="The last runs of one job, newest first",
        description="With a store: the claimed runs of every instance (bounded retention). "
        "Without: the last 50 of the process that answers.",
        responses={**_NOT_FOUND, **_NO_STORE},
    )
    async def get_runs(
        name: str, limit: Annotated[int, Query(ge=1, le=MAX_RUNS)] = 20
    ) -> list[RunRecord]:
        try:
            return await scheduler.runs(name, limit=limit)
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            _fail(exc)

    return router


class TriggerAccepted(BaseModel):
    """A run asked for and started (202), not yet ended."""

    id: str = Field(description="The run's id in GET /jobs/{name}/runs.")
    job: str
    tick: datetime
    instance: str = Field(description="The instance that runs it.")
    runs: str = Field(description="Where to watch it: the job's run history.")


class TriggerEnded(TriggerAccepted):
    """A run asked for with ?wait=true that ended (200)."""

    outcome: Outcome | None = Field(description="None: it never ran to an end (the app stopped).")
    attempts: int
    duration_s: float | None
    error: ErrorInfo | None


def build_control_router(scheduler: Scheduler, dependencies: Sequence[Any]) -> APIRouter:
    router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=list(dependencies))

    @router.post(
        "/{name}/run",
        status_code=202,
        response_model=TriggerAccepted,
        summary="Run a job now",
        description="With a store the run is claimed like a tick: it runs on one instance, "
        "and no scheduled tick runs beside it. 202 once started; with wait=true, 200 "
        "with the outcome once ended (202 if it has not ended within `timeout`).",
        responses={
            200: {"model": TriggerEnded, "description": "It ended (wait=true)."},
            409: {"description": "A run of the job is going (when it started, and where)."},
            **_NOT_FOUND,
            **_NO_STORE,
        },
    )
    async def run(
        request: Request,
        name: str,
        wait: bool = False,
        timeout: Annotated[float, Query(gt=0, le=_MAX_WAIT)] = _WAIT,  # noqa: ASYNC109 - a query parameter
    ) -> Any:
        try:
            triggered = await scheduler.trigger(name)
        except (JobNotFoundError, JobRunningError, StoreError, NotRunningError) as exc:
            _fail(exc)
        started = TriggerAccepted(
            id=triggered.id,
            job=name,
            tick=triggered.tick,
            instance=triggered.instance,
            # This path, .../jobs/{name}/run, with the app's own prefixes: + "s".
            runs=request.url.path + "s",
        )
        if not wait:
            return started
        with anyio.move_on_after(timeout):
            result = await triggered.wait()
            ended = TriggerEnded(
                **started.model_dump(),
                outcome=None if result is None else result.outcome,
                attempts=0 if result is None else result.attempts,
                duration_s=None if result is None else result.duration_s,
                error=None
                if result is None or result.error is None
                else ErrorInfo.of(result.error),
            )
            return JSONResponse(ended.model_dump(mode="json"), status_code=200)
        return started

    @router.post(
        "/{name}/pause",
        response_model=PauseState,
        summary="Pause a job",
        description="Its ticks are skipped (skipped.paused) until resumed, or until `until` "
        "(an instant with a time zone). With a store: on every instance from its next tick, "
        "and across restarts (scope 'cluster'); without: this process (scope 'process').",
        responses={
            **_NOT_FOUND,
            **_NO_STORE,
            422: {"description": "`until` is not in the future."},
        },
    )
    async def pause(name: str, until: datetime | None = None) -> PauseState:
        try:
            return await scheduler.pause(name, until=until)
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            _fail(exc)

    @router.post(
        "/{name}/resume",
        response_model=PauseState,
        summary="Resume a paused job",
        responses={**_NOT_FOUND, **_NO_STORE},
    )
    async def resume(name: str) -> PauseState:
        try:
            return await scheduler.resume(name)
        except (JobNotFoundError, StoreError) as exc:
            _fail(exc)

    return router
