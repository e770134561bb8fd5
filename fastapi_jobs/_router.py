"""The status router: read-only JSON views of the scheduler's jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, HTTPException

from ._errors import JobNotFoundError
from ._status import JobStatus

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ["build_router"]


def build_router(scheduler: Scheduler) -> APIRouter:
    router = APIRouter(prefix="/jobs", tags=["jobs"])

    @router.get("", response_model=list[JobStatus], summary="Status of every job")
    async def list_jobs() -> list[JobStatus]:
        return scheduler.status()

    @router.get(
        "/{name}",
        response_model=JobStatus,
        summary="Status of one job",
        responses={404: {"description": "No job has this name."}},
    )
    async def get_job(name: str) -> JobStatus:
        try:
            return scheduler.job_status(name)
        except JobNotFoundError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None

    return router
