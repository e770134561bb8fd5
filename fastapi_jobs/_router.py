"""The routers: read-only JSON views of the jobs (``router``), and the control
endpoints (``control_router``), which the app must put behind its own auth."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from starlette.routing import NoMatchFound

from ._checks import MAX_NAME
from ._control import MAX_RUNS
from ._errors import (
    ConfigurationError,
    JobNotFoundError,
    JobRunningError,
    NotRunningError,
    StoreError,
    UnconfirmedError,
)
from ._page import ASSETS, CHART_RUNS, CSP, PAGE_JOBS, Links, notice_url, render
from ._status import ErrorInfo, InstanceStatus, JobStatus, Outcome, PauseState, RunRecord

if TYPE_CHECKING:
    from ._seam import Seam

__all__ = ["build_control_router", "build_router"]

# POST /jobs/{name}/run?wait=true waits this long by default, at most _MAX_WAIT.
_WAIT = 30.0
_MAX_WAIT = 300.0

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No job has this name."}}
_NO_STORE: dict[int | str, dict[str, Any]] = {
    503: {"description": "The store cannot be reached, or the app is stopping: nothing changed."}
}
_CHANGE_UNSURE: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "The store cannot be reached or refused the change: nothing changed; "
        "or it did not confirm the change in time: it may have been made, and "
        "GET /jobs/{name} shows whether it was (the detail says which)."
    }
}


# What the status page says of an operation's error (else: "unavailable").
_NOTICE_OF: tuple[tuple[type[Exception], str], ...] = (
    (UnconfirmedError, "unsure"),
    (JobNotFoundError, "unknown"),
    (JobRunningError, "running"),
    (ConfigurationError, "invalid"),
)


def _fail(exc: Exception, page: str | None = None, name: str = "") -> NoReturn:
    """The HTTP answer of an operation's error; for a form of the status page
    (``page``: its path), a redirect back to it that says what happened."""
    if page is not None:
        code = next((c for kind, c in _NOTICE_OF if isinstance(exc, kind)), "unavailable")
        raise HTTPException(303, headers={"Location": notice_url(page, code, name)}) from None
    if isinstance(exc, JobNotFoundError):
        raise HTTPException(404, str(exc)) from None
    if isinstance(exc, ConfigurationError):
        raise HTTPException(422, str(exc)) from None
    if isinstance(exc, (StoreError, NotRunningError)):
        raise HTTPException(503, str(exc)) from None
    raise exc


def _path(request: Request, route: str, **params: str) -> str | None:
    """The path of one of our routes in this app (its prefixes and root path
    included), or None if the app does not have it."""
    try:
        return request.url_for(route, **params).path
    except NoMatchFound:
        return None


def _from_page(request: Request) -> str | None:
    """The status page's path if ``request`` is one of its forms (a browser's
    navigation, which asks for HTML), else None: an API call gets JSON."""
    if "text/html" not in request.headers.get("accept", ""):
        return None
    return _path(request, "fastapi_jobs_ui")


async def _same_origin(request: Request) -> None:
    """Refuse a cross-origin browser request (CSRF): a page elsewhere must not
    make a logged-in browser run or pause jobs. Browsers say where a request
    comes from (Sec-Fetch-Site; Origin in older ones); a client that says
    neither is not a browser (curl, httpx, the CLI), which no other site drives."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site in ("same-origin", "none"):
            return
    else:
        origin = request.headers.get("origin")
        if origin is None:
            return
        host = request.headers.get("host")
        if host is not None and origin.partition("://")[2] == host:
            return
    raise HTTPException(403, "cross-origin request refused: operate jobs from this app's own page")


_PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def build_router(seam: Seam) -> APIRouter:
    router = APIRouter(prefix="/jobs", tags=["jobs"])

    # Before /{name}, which would take "ui" for a job's name.
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
            f"{_path(request, 'fastapi_jobs_ui_asset', file=name)}?v={ASSETS[name].version}"
            for name in ("ui.css", "ui.js", "icon.svg")
        )
        run = _path(request, "fastapi_jobs_run", name="-")
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
        )
        return HTMLResponse(html, headers=_PAGE_HEADERS)

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

    @router.get(
        "/{name}",
        response_model=JobStatus,
        summary="Status of one job",
        responses=_NOT_FOUND,
    )
    async def get_job(name: str) -> JobStatus:
        if name not in seam.jobs:
            _fail(JobNotFoundError(name, list(seam.jobs)))
        return next(s for s in await seam.cluster_status() if s.name == name)

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
            return await seam.runs(name, limit)
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            _fail(exc)

    # After /{name}/runs: a job named "ui" has its runs at /jobs/ui/runs.
    @router.get("/ui/{file}", name="fastapi_jobs_ui_asset", include_in_schema=False)
    async def asset(file: str) -> Response:
        found = ASSETS.get(file)
        if found is None:
            raise HTTPException(404, "no such file")
        headers = {"Cache-Control": "public, max-age=31536000, immutable"}  # versioned: ?v=
        return Response(found.body, media_type=found.media_type, headers=headers)

    return router


class RunConflict(BaseModel):
    """A run of the job is going (409): ``detail`` says so, as every error's does."""

    detail: str
    started_at: datetime | None = Field(description="When the run going started, if known.")
    instance: str | None = Field(description="The instance running it, if known.")


def _conflict(exc: JobRunningError) -> JSONResponse:
    body = RunConflict(detail=str(exc), started_at=exc.started_at, instance=exc.instance)
    return JSONResponse(body.model_dump(mode="json"), status_code=409)


def _until(until: str | None) -> datetime | None:
    """The ``until`` of a pause, as an instant. A '+' in a query string is a space
    once decoded, so ``?until=2026-12-01T08:00:00+00:00`` sent unencoded arrives
    as ``...08:00:00 00:00``: read as the offset it was."""
    if until is None:
        return None
    text = until.strip()
    for attempt in (text, "+".join(text.rsplit(" ", 1))):
        try:
            return datetime.fromisoformat(attempt)
        except ValueError:
            continue
    raise ConfigurationError(
        f"until={until[:60]!r} is not an ISO 8601 instant: e.g. 2026-12-01T08:00:00Z"
    )


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


def build_control_router(seam: Seam, dependencies: Sequence[Any]) -> APIRouter:
    router = APIRouter(
        prefix="/jobs", tags=["jobs"], dependencies=[Depends(_same_origin), *dependencies]
    )

    @router.post(
        "/{name}/run",
        name="fastapi_jobs_run",
        status_code=202,
        response_model=TriggerAccepted,
        summary="Run a job now",
        description="With a store the run is claimed like a tick: it runs on one instance, "
        "and no scheduled tick runs beside it. 202 once started; with wait=true, 200 "
        "with the outcome once ended (202 if it has not ended within `timeout`).",
        responses={
            200: {"model": TriggerEnded, "description": "It ended (wait=true)."},
            409: {
                "model": RunConflict,
                "description": "A run of the job is going (when it started, and where).",
            },
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
        page = _from_page(request)
        try:
            triggered = await seam.trigger(name)
        except JobRunningError as exc:
            if page is None:
                return _conflict(exc)
            _fail(exc, page, name)
        except (JobNotFoundError, StoreError, NotRunningError) as exc:
            _fail(exc, page, name)
        if page is not None:
            return RedirectResponse(notice_url(page, "started", name), status_code=303)
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
        name="fastapi_jobs_pause",
        response_model=PauseState,
        summary="Pause a job",
        description="Its ticks are skipped (skipped.paused) until resumed, or until `until` "
        "(an instant with a time zone). With a store: on every instance from its next tick, "
        "and across restarts (scope 'cluster'); without: this process (scope 'process').",
        responses={
            **_NOT_FOUND,
            **_CHANGE_UNSURE,
            422: {"description": "`until` is not in the future."},
        },
    )
    async def pause(
        request: Request,
        name: str,
        until: Annotated[
            str | None,
            Query(
                max_length=100,
                description="The pause's end: an ISO 8601 instant with its zone, e.g. "
                "2026-12-01T08:00:00Z.",
            ),
        ] = None,
    ) -> Any:
        page = _from_page(request)
        try:
            state = await seam.pause(name, _until(until))
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            _fail(exc, page, name)
        return _answer(page, "paused", state)

    @router.post(
        "/{name}/resume",
        name="fastapi_jobs_resume",
        response_model=PauseState,
        summary="Resume a paused job",
        responses={**_NOT_FOUND, **_CHANGE_UNSURE},
    )
    async def resume(request: Request, name: str) -> Any:
        page = _from_page(request)
        try:
            state = await seam.resume(name)
        except (JobNotFoundError, StoreError) as exc:
            _fail(exc, page, name)
        return _answer(page, "resumed", state)

    return router


def _answer(page: str | None, notice: str, state: PauseState) -> Any:
    """A pause's answer: the state (JSON), or back to the page that asked."""
    if page is None:
        return state
    return RedirectResponse(notice_url(page, notice, state.job), status_code=303)
