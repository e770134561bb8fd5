"""``POST /jobs/{name}/backfill`` on the control router (its auth and its
same-origin rule): a backfill (``_backfill.runs``) checked, then started in the
running scheduler's background; 202 says where its runs show.

The body is read here rather than by FastAPI: bounded in size before it is
parsed, and every mistake in it one 422 whose ``detail`` says what to write."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from .._backfill.runs import MAX_TICKS
from .._errors import ConfigurationError, JobNotFoundError, JobRunningError, NotRunningError
from .http import NOT_FOUND, fail, read_json

if TYPE_CHECKING:
    from .._core.seam import Seam

__all__ = ["add_backfill"]

_MAX_BODY = 1024
_EXAMPLE = '{"since": "2026-12-01T00:00:00Z", "until": "2026-12-02T00:00:00Z"}'


class BackfillBody(BaseModel):
    """The body of ``POST /jobs/{name}/backfill``."""

    model_config = ConfigDict(extra="forbid")
    since: str = Field(max_length=100, description="The range's start: an ISO 8601 instant.")
    until: str = Field(max_length=100, description="The range's end (included), in the past.")
    max_ticks: StrictInt = Field(MAX_TICKS, description="The most ticks the range may have.")


class BackfillAccepted(BaseModel):
    """A backfill checked and started (202), not yet ended."""

    job: str
    ticks: int = Field(description="The job's ticks in the range, each run oldest first.")
    since: datetime
    until: datetime
    runs: str = Field(description="Where to watch it: the job's run history.")


def add_backfill(router: APIRouter, seam: Seam) -> None:
    """The endpoint, on the control router; its backfills run in a service of
    the scheduler (started with it, stopped as it stops)."""
    engine = seam.backfills  # the scheduler's own (Scheduler.backfill)
    engine.serve_in(seam.add_service)

    @router.post(
        "/{name}/backfill",
        name="fastapi_jobs_backfill",
        status_code=202,
        response_model=BackfillAccepted,
        summary="Run a job once for every tick of a past range",
        description="Oldest first, one at a time, each tick claimed like a live one (with a "
        "store, a tick that ran already is skipped). 202 once checked and started; the runs "
        "show in GET /jobs/{name}/runs. Body: " + _EXAMPLE + ', and "max_ticks" (default '
        f"{MAX_TICKS}).",
        responses={
            409: {"description": "A backfill of the job is going."},
            422: {"description": "The body or the range is wrong: `detail` says how."},
            503: {"description": "The scheduler is not running."},
            **NOT_FOUND,
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": BackfillBody.model_json_schema()}},
            }
        },
    )
    async def backfill(request: Request, name: str) -> Any:
        body = await _read(request)
        try:
            since, until = _instant("since", body.since), _instant("until", body.until)
            runner, ticks = engine.check(name, since, until, body.max_ticks)
            engine.start(runner, ticks, since, until)
        except JobRunningError as exc:
            raise HTTPException(409, str(exc)) from None
        except (JobNotFoundError, ConfigurationError, NotRunningError) as exc:
            fail(exc)
        return BackfillAccepted(
            job=name,
            ticks=len(ticks),
            since=since,
            until=until,
            # This path, .../jobs/{name}/backfill, made .../jobs/{name}/runs.
            runs=request.url.path.rsplit("/", 1)[0] + "/runs",
        )


def _instant(what: str, text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"{what}={text[:60]!r} is not an ISO 8601 instant: e.g. 2026-12-01T08:00:00Z"
        ) from None


async def _read(request: Request) -> BackfillBody:
    """The body, or a 415 or 422 saying what is wrong with it."""
    return await read_json(request, BackfillBody, _MAX_BODY, _EXAMPLE)
