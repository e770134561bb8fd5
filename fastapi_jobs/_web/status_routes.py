"""The read-only router: JSON views of the jobs (``GET /jobs``, ``/jobs/{name}``,
its runs, the instances, the schedules made at run time) and the status page
(``GET /jobs/ui``) with its assets. The control endpoints are in
``_web.control_routes``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response

from .._checks import MAX_NAME
from .._control import MAX_RUNS
from .._errors import ConfigurationError, JobNotFoundError, StoreError
from .._status import InstanceStatus, JobStatus, RunRecord
from .http import NO_STORE, NOT_FOUND, fail, path_of
from .page import ASSETS, CHART_RUNS, CSP, PAGE_JOBS, Links, render
from .schedule_routes import add_schedule_list

if TYPE_CHECKING:
    from .._core.seam import Seam

__all__ = ["build_router"]

_PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def build_router(seam: Seam) -> APIRouter:
    router = APIRouter(prefix="/jobs", tags=["jobs"])
    # The page and its assets before /{name}: "ui" is a reserved name
    # (_core/declarations.RESERVED), never a job's, and the routes say so by their order.
    _add_page(router, seam)
    _add_status(router, seam)
    _add_runs(router, seam)
    _add_assets(router)
    return router


def _add_page(router: APIRouter, seam: Seam) -> None:
    @router.get("/ui", response_class=HTMLResponse, name="fastapi_jobs_ui", include_in_schema=False)
    async def page(
        request: Request,
        notice: str | None = None,
        job: str | None = None,
        q: Annotated[str, Query(max_length=MAX_NAME)] = "",
    ) -> Response:
        view = await seam.cluster()
        statuses = seam.statuses(view)
        # The jobs whose name holds q, at most PAGE_JOBS: a page (and its charts'
        # read of the store) stays small with thousands of jobs.
        wanted = q.casefold()
        matched = [s for s in statuses if wanted in s.name.casefold()]
        shown = matched[:PAGE_JOBS]
        runs = await seam.recent_runs([s.name for s in shown], CHART_RUNS)
        here = request.url.path
        css, js, icon = (
            f"{path_of(request, 'fastapi_jobs_ui_asset', file=name)}?v={ASSETS[name].version}"
            for name in ("ui.css", "ui.js", "icon.svg")
        )
        run = path_of(request, "fastapi_jobs_run", name="-")
        html = render(
            shown,
            runs,
            view,
            links=Links(
                page=here, css=css, js=js, icon=icon, control=None if run is None else run[:-6]
            ),
            now=seam.now(),
            running=seam.running,
            store=seam.store is not None,
            instance=seam.instance_id,
            notice=notice,
            notice_job=job if job in seam.jobs else None,
            query=q,
            total=len(statuses),
            matched=len(matched),
            unknown=seam.left_alone(),
        )
        return HTMLResponse(html, headers=_PAGE_HEADERS)


def _add_status(router: APIRouter, seam: Seam) -> None:
    @router.get("", response_model=list[JobStatus], summary="Status of every job")
    async def list_jobs() -> list[JobStatus]:
        return await seam.cluster_status()

    @router.get(
        "/instances",
        response_model=list[InstanceStatus],
        summary="App instances sharing the store, seen recently",
    )
    async def list_instances() -> list[InstanceStatus]:
        view = await seam.cluster()
        return [] if view is None else view.instances

    add_schedule_list(router, seam)  # before /{name}, as /instances

    @router.get(
        "/{name}",
        response_model=JobStatus,
        summary="Status of one job",
        responses=NOT_FOUND,
    )
    async def get_job(name: str) -> JobStatus:
        if name not in seam.jobs:
            fail(JobNotFoundError(name, list(seam.jobs)))
        # A stored schedule removed elsewhere may be gone once the store has answered.
        found = [s for s in await seam.cluster_status() if s.name == name]
        if not found:
            fail(JobNotFoundError(name, list(seam.jobs)))
        return found[0]


def _add_runs(router: APIRouter, seam: Seam) -> None:
    @router.get(
        "/{name}/runs",
        response_model=list[RunRecord],
        summary="The last runs of one job, newest first",
        description="With a store: the claimed runs of every instance (bounded retention). "
        "Without: the last 50 of the process that answers.",
        responses={**NOT_FOUND, **NO_STORE},
    )
    async def get_runs(
        name: str, limit: Annotated[int, Query(ge=1, le=MAX_RUNS)] = 20
    ) -> list[RunRecord]:
        try:
            return await seam.runs(name, limit)
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            fail(exc)


def _add_assets(router: APIRouter) -> None:
    @router.get("/ui/{file}", name="fastapi_jobs_ui_asset", include_in_schema=False)
    async def asset(file: str) -> Response:
        found = ASSETS.get(file)
        if found is None:
            raise HTTPException(404, "no such file")
        headers = {"Cache-Control": "public, max-age=31536000, immutable"}  # versioned: ?v=
        return Response(found.body, media_type=found.media_type, headers=headers)
