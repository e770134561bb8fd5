"""The read-only router: JSON views of the jobs (``GET /jobs``, ``/jobs/{name}``,
its runs, the instances, the schedules made at run time) and the status page
(``GET /jobs/ui``) with its assets. The control endpoints are in
``_web.control_routes``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from .._control import MAX_RUNS
from .._errors import ConfigurationError, JobNotFoundError, StoreError
from .._status import ClusterView, InstanceStatus, JobStatus, RunRecord
from .http import NO_STORE, NOT_FOUND, checked_query, fail, path_of, state_said
from .page import ASSETS, CHART_RUNS, CSP, PAGE_JOBS, Links, render
from .paging import Ask, asked, headers, matching
from .schedule_routes import add_schedule_list

if TYPE_CHECKING:
    from .._core.seam import Seam

__all__ = ["build_router"]

_JOBS = asked("jobs", 100)
_PAGE = asked("jobs", PAGE_JOBS)
_RUNS = asked("runs", 20, filters=False)
_PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def build_router(seam: Seam) -> APIRouter:
    checks = [Depends(checked_query), Depends(state_said(seam))]
    router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=checks)
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
        ask: Annotated[Ask, Depends(_PAGE)],
        notice: str | None = None,
        job: str | None = None,
    ) -> Response:
        # The jobs the filters keep, a page of them (PAGE_JOBS): the page, and its
        # reads of the store, stay small with 100,000 jobs.
        unknown = [u for u in seam.left_alone() if ask.wants(u[0])]
        names: list[str] = []
        if ask.state == "left_alone":  # no job: the schedules it cannot run, below
            view, matched, after = await seam.cluster(names), 0, None
        else:
            view, matched, names, after = await _jobs(seam, ask)
        shown = seam.statuses(view, names)
        runs = await seam.recent_runs(names, CHART_RUNS)
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
            scheduler=seam.state(f"GET {here}"),
            store=seam.store is not None,
            instance=seam.instance_id,
            notice=notice,
            notice_job=job if job in seam.names() else None,
            query=ask.q,
            state=ask.state,
            total=len(seam.names()),
            matched=matched,
            pages=_pages(request, ask, after),
            unknown=unknown,
        )
        return HTMLResponse(html, headers=_PAGE_HEADERS)


def _pages(request: Request, ask: Ask, after: str | None) -> tuple[str | None, str | None]:
    """The page's links to the first page of its filters (once past it) and to the next."""
    url = request.url.remove_query_params(["notice", "job", "cursor"])
    first = None if ask.after is None else f"{url.path}?{url.query}".rstrip("?")
    nxt = None if after is None else f"{url.path}?{url.include_query_params(cursor=after).query}"
    return first, nxt


def _add_status(router: APIRouter, seam: Seam) -> None:
    @router.get(
        "",
        response_model=list[JobStatus],
        summary="Status of the jobs, a page at a time",
        description="The jobs this instance runs, by name, a page at a time (100 unless "
        "`limit` says; `limit=all`: every one). `X-Total-Count` says how many match the "
        'filters; `Link: <...>; rel="next"` is the next page (none after the last).',
        responses={
            422: {
                "description": "A bad `limit`, `cursor`, `state` or `q`: the detail "
                "says what to write."
            }
        },
    )
    async def list_jobs(
        request: Request, response: Response, ask: Annotated[Ask, Depends(_JOBS)]
    ) -> list[JobStatus]:
        if ask.state == "left_alone":
            raise HTTPException(
                422,
                "state: GET /jobs lists the jobs this instance runs; the schedules it "
                "cannot run are in GET /jobs/schedules?state=left_alone",
            )
        view, total, shown, after = await _jobs(seam, ask)
        response.headers.update(headers(request, total, after))
        return seam.statuses(view, shown)

    @router.get(
        "/instances",
        response_model=list[InstanceStatus],
        summary="App instances sharing the store, seen recently",
    )
    async def list_instances() -> list[InstanceStatus]:
        view = await seam.cluster(())  # no job's claim: the instances are in every reading
        return [] if view is None else view.instances

    add_schedule_list(router, seam)  # before /{name}, as /instances

    @router.get(
        "/{name}",
        response_model=JobStatus,
        summary="Status of one job",
        responses=NOT_FOUND,
    )
    async def get_job(name: str) -> JobStatus:
        if name not in seam.names():
            fail(JobNotFoundError(name, list(seam.names())))
        # A stored schedule removed elsewhere may be gone once the store has answered.
        found = seam.statuses(await seam.cluster([name]), [name])
        if not found:
            fail(JobNotFoundError(name, list(seam.names())))
        return found[0]


async def _jobs(seam: Seam, ask: Ask) -> tuple[ClusterView | None, int, list[str], str | None]:
    """Of the jobs, those the filters keep: the cluster's view of them, how many
    they are, the names of the page asked, and the next page's cursor. A status
    is built for the page's jobs only, and the store's claims are read for them
    only; for failing or running, the claims that can say so."""
    if ask.state in (None, "paused"):
        # A pause is in every reading, and comes first of the states: the claims
        # of the page's jobs are all that is read.
        found = (
            seam.names() if ask.state is None else seam.in_state(await seam.cluster(()), "paused")
        )
        names = matching(found, ask)
        shown, after = ask.page(names, str)
        view = await seam.cluster(shown)
    else:
        # The claims that can make a job failing or running: its page's are among them.
        view = await seam.unwell()
        names = matching(seam.in_state(view, ask.state), ask)
        shown, after = ask.page(names, str)
    return view, len(names), shown, after


def _add_runs(router: APIRouter, seam: Seam) -> None:
    @router.get(
        "/{name}/runs",
        response_model=list[RunRecord],
        summary="The runs of one job, newest first, a page at a time",
        description="With a store: the claimed runs of every instance (bounded retention). "
        f"Without: the last 50 of the process that answers. The newest {MAX_RUNS} can be "
        "paged through (20 a page unless `limit` says; `limit=all`: all of them); "
        "`X-Total-Count` counts them, and `Link` is the next page.",
        responses={**NOT_FOUND, **NO_STORE},
    )
    async def get_runs(
        request: Request,
        response: Response,
        name: str,
        ask: Annotated[Ask, Depends(_RUNS)],
    ) -> list[RunRecord]:
        try:
            # The window every page is cut from: at most MAX_RUNS, as many as the
            # history keeps (100 a job by default), so its count is the total.
            records = await seam.runs(name, MAX_RUNS)
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            fail(exc)
        shown, after = ask.page(records, _run_key)
        found = headers(request, len(records), after)
        response.headers.update(found)
        return shown


def _run_key(run: RunRecord) -> int:
    """A run's place in its job's history: its claim's fence, else the count of
    this process's runs of the job (its id, ``instance#n``)."""
    return run.fence if run.fence is not None else int(run.id.rpartition("#")[2])


def _add_assets(router: APIRouter) -> None:
    @router.get("/ui/{file}", name="fastapi_jobs_ui_asset", include_in_schema=False)
    async def asset(file: str, v: str | None = None) -> Response:
        # `v`, the file's version, is for caches: a new one is a new URL.
        found = ASSETS.get(file)
        if found is None:
            raise HTTPException(404, "no such file")
        headers = {"Cache-Control": "public, max-age=31536000, immutable"}  # versioned: ?v=
        return Response(found.body, media_type=found.media_type, headers=headers)
