"""The status router: read-only JSON views of the scheduler's jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, HTTPException

from ._errors import JobNotFoundError
from ._status import InstanceStatus, JobStatus

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ["build_router"]


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
        responses={404: {"description": "No job has this name."}},
    )
    async def get_job(name: str) -> JobStatus:
        if name not in scheduler.jobs:
            raise HTTPException(
                status_code=404, detail=str(JobNotFoundError(name, list(scheduler.jobs)))
            )
        return next(s for s in await scheduler.cluster_status() if s.name == name)

    return router
