"""The control router: ``POST /jobs/{name}/run``, ``/pause``, ``/resume`` and
``/backfill`` (``_web.backfill_routes``), and the changes to schedules made at run
time (``_web.schedule_routes``), which the app must put behind its own auth
(``Scheduler.control_router``), and which refuses cross-origin browser requests
(CSRF)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import anyio
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse
from pydantic import BaseModel, Field

from .._dynamic.bounds import ScheduleBounds
from .._errors import (
    ConfigurationError,
    JobNotFoundError,
    JobRunningError,
    NotRunningError,
    StoreError,
)
from .._status import ErrorInfo, Outcome, PauseState
from .backfill_routes import add_backfill
from .http import NO_STORE, NOT_FOUND, checked_query, fail, from_page, state_said
from .page import notice_url
from .schedule_routes import add_schedule_changes

if TYPE_CHECKING:
    from .._core.seam import Seam

__all__ = ["build_control_router"]

# POST /jobs/{name}/run?wait=true waits this long by default, at most _MAX_WAIT.
_WAIT = 30.0
_MAX_WAIT = 300.0

_CHANGE_UNSURE: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "The store cannot be reached or refused the change: nothing changed; "
        "or it did not confirm the change in time: it may have been made, and "
        "GET /jobs/{name} shows whether it was (the detail says which)."
    }
}


async def _same_origin(request: Request) -> None:
    """Refuse a cross-origin browser request (CSRF): a page elsewhere must not
    make a logged-in browser run or pause jobs. Browsers say where a request
    comes from (Sec-Fetch-Site; Origin in older ones); a client that says
    neither is not a browser (curl, httpx, the CLI), which no other site drives.
    An Origin is this app's when its scheme, host and port are the request's
    (behind a proxy that ends TLS, uvicorn's --proxy-headers tells the scheme)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site in ("same-origin", "none"):
            return
    else:
        origin = request.headers.get("origin")
        if origin is None:
            return
        host = request.headers.get("host")
        if host is not None and origin.lower() == f"{request.url.scheme}://{host}".lower():
            return
    raise HTTPException(403, "cross-origin request refused: operate jobs from this app's own page")


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
    # Checked here, not by Query(max_length=): FastAPI's 422 would echo it whole.
    for attempt in (text, "+".join(text.rsplit(" ", 1))) if len(text) <= 100 else ():
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


def build_control_router(
    seam: Seam, dependencies: Sequence[Any], bounds: ScheduleBounds
) -> APIRouter:
    # The app's auth before the query's check: a 401 first, as for a bad body.
    checks = [Depends(_same_origin), *dependencies, Depends(checked_query)]
    checks.append(Depends(state_said(seam)))
    router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=checks)
    _add_run(router, seam)
    _add_pauses(router, seam)
    add_schedule_changes(router, seam, bounds)
    add_backfill(router, seam)
    return router


def _add_run(router: APIRouter, seam: Seam) -> None:
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
            **NOT_FOUND,
            **NO_STORE,
        },
    )
    async def run(
        request: Request,
        name: str,
        wait: bool = False,
        timeout: Annotated[float, Query(gt=0, le=_MAX_WAIT)] = _WAIT,  # noqa: ASYNC109 - a query parameter
    ) -> Any:
        return await _run(seam, request, name, wait, timeout)


async def _run(seam: Seam, request: Request, name: str, wait: bool, limit: float) -> Any:
    """``POST /jobs/{name}/run``: start the run, and (``wait``) wait for its end
    up to ``limit``; or the error, said in JSON or on the page that asked."""
    page = from_page(request)
    try:
        triggered = await seam.trigger(name)
    except JobRunningError as exc:
        if page is None:
            return _conflict(exc)
        fail(exc, page, name)
    except (JobNotFoundError, StoreError, NotRunningError) as exc:
        fail(exc, page, name)
    if page is not None:
        return RedirectResponse(notice_url(page, "started", name), status_code=303)
    started = TriggerAccepted(
        id=triggered.id,
        job=name,
        tick=triggered.tick,
        instance=triggered.instance,
        # This path, .../jobs/{name}/run, with the app's own prefixes, as the
        # client sent it (encoded: a name may hold anything a URL escapes): + "s".
        runs=_sent_path(request) + "s",
    )
    if not wait:
        return started
    with anyio.move_on_after(limit):
        result = await triggered.wait()
        ended = TriggerEnded(
            **started.model_dump(),
            outcome=None if result is None else result.outcome,
            attempts=0 if result is None else result.attempts,
            duration_s=None if result is None else result.duration_s,
            error=None if result is None or result.error is None else ErrorInfo.of(result.error),
        )
        return JSONResponse(ended.model_dump(mode="json"), status_code=200)
    return started


def _add_pauses(router: APIRouter, seam: Seam) -> None:
    @router.post(
        "/{name}/pause",
        name="fastapi_jobs_pause",
        response_model=PauseState,
        summary="Pause a job",
        description="Its ticks are skipped (skipped.paused) until resumed, or until `until` "
        "(an instant with a time zone). With a store: on every instance from its next tick, "
        "and across restarts (scope 'cluster'); without: this process (scope 'process').",
        responses={
            **NOT_FOUND,
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
                description="The pause's end: an ISO 8601 instant with its zone, e.g. "
                "2026-12-01T08:00:00Z.",
            ),
        ] = None,
    ) -> Any:
        page = from_page(request)
        try:
            state = await seam.pause(name, _until(until))
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            fail(exc, page, name)
        return _answer(page, "paused", state)

    @router.post(
        "/{name}/resume",
        name="fastapi_jobs_resume",
        response_model=PauseState,
        summary="Resume a paused job",
        responses={**NOT_FOUND, **_CHANGE_UNSURE},
    )
    async def resume(request: Request, name: str) -> Any:
        page = from_page(request)
        try:
            state = await seam.resume(name)
        except (JobNotFoundError, StoreError) as exc:
            fail(exc, page, name)
        return _answer(page, "resumed", state)


def _answer(page: str | None, notice: str, state: PauseState) -> Any:
    """A pause's answer: the state (JSON), or back to the page that asked."""
    if page is None:
        return state
    return RedirectResponse(notice_url(page, notice, state.job), status_code=303)


def _sent_path(request: Request) -> str:
    """The request's path as the client sent it, percent-encoded: the ASGI
    server's ``raw_path`` (without a query, which some servers keep in it), or
    the decoded path encoded again."""
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes):
        return raw.split(b"?", 1)[0].decode("latin-1")
    return quote(request.url.path, safe="/")
