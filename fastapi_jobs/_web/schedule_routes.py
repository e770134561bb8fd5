"""Schedules made at run time over HTTP: ``GET /jobs/schedules`` on the status
router (a page at a time: ``_web.paging``); ``POST /jobs/schedules``, ``PATCH``
and ``DELETE /jobs/schedules/{name}`` on the control router (its auth and its same-origin rule).

A change's body is read here rather than by FastAPI: bounded in size before it
is parsed, and every mistake in it one 422 whose ``detail`` says what to write,
as the other endpoints' errors do, without echoing back what was sent.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from .._checks import MAX_NAME
from .._dynamic.bounds import ScheduleBounds
from .._dynamic.sets import ScheduleSpec
from .._dynamic.stored import MAX_SPEC, StoredSchedule, schedule_from
from .._errors import (
    ConfigurationError,
    JobNotFoundError,
    NameTakenError,
    StoreError,
    TooManySchedulesError,
)
from .._schedules import Schedule
from .http import fail, read_json
from .paging import Ask, asked, headers

if TYPE_CHECKING:
    from .._core.seam import Seam

__all__ = ["ScheduleInfo", "add_schedule_changes", "add_schedule_list"]

MAX_BODY = MAX_SPEC + 2 * MAX_NAME + 1024
"""The most bytes a change's body may take: what the store keeps of a schedule,
its name and task, and the JSON around them."""

_SPEC = (
    '{"every": seconds, "offset": seconds} (offset 0 if left out) or '
    '{"cron": "0 7 * * *", "tz": "Europe/Lisbon"} (tz UTC if left out)'
)
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No schedule has this name."}}
_BAD: dict[int | str, dict[str, Any]] = {
    422: {"description": "The body is not a schedule: `detail` says what is wrong."}
}
_STORE: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "The store cannot be reached or refused the change: nothing changed; "
        "or it did not confirm the change in time: it may have been made, and "
        "GET /jobs/schedules shows whether it was (the detail says which)."
    }
}


class ScheduleInfo(BaseModel):
    """A schedule made at run time (``StoredSchedule.to_dict()``)."""

    name: str = Field(description="Its name, which is also its job's.")
    task: str = Field(description="The function it runs (registered with @scheduler.task()).")
    schedule: dict[str, Any] | None = Field(
        description=f"{_SPEC} None: a spec this release cannot read (written by a newer one)."
    )
    describe: str = Field(description="The schedule in words, as GET /jobs says it.")
    kwargs: dict[str, Any] = Field(description="What each run passes the task, by keyword.")
    options: dict[str, Any] = Field(description="The job's options (durations in seconds).")
    version: int = Field(description="Grows with each change.")
    updated_at: datetime | None
    known: bool = Field(
        description="False: this instance leaves the schedule alone (see left_alone), and "
        "the instances that can run it do."
    )
    group: str | None = Field(
        default=None,
        description="The set it was applied with (PUT /jobs/schedules?group=); null: made by name.",
    )
    left_alone: str | None = Field(
        default=None,
        description="Why this instance leaves it alone: its task missing, arguments its task "
        "does not take, a spec it cannot read, a declared job's name. Null while it runs it.",
    )

    @classmethod
    def of(cls, stored: StoredSchedule) -> ScheduleInfo:
        # Its kwargs as shown: secrets hidden, and no lone surrogate to fail the listing.
        return cls.model_validate(stored.to_dict())


class NewSchedule(BaseModel):
    """The body of ``POST /jobs/schedules``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    task: str
    schedule: dict[str, Any] = Field(description=_SPEC)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="timeout, retries, retry_backoff, retry_timeouts, paused, catch_up, "
        "every_instance, overlap, jitter (durations in seconds).",
    )


class ScheduleChange(BaseModel):
    """The body of ``PATCH /jobs/schedules/{name}``: what is given replaces what
    the schedule had (kwargs as a whole; each option given, that option)."""

    model_config = ConfigDict(extra="forbid")

    task: str | None = None
    schedule: dict[str, Any] | None = Field(default=None, description=_SPEC)
    kwargs: dict[str, Any] | None = None
    options: dict[str, Any] | None = None


class ScheduleSet(BaseModel):
    """The body of ``PUT /jobs/schedules?group=``: the group's schedules, all of them."""

    model_config = ConfigDict(extra="forbid")

    schedules: list[NewSchedule] = Field(
        description="Every schedule of the group, as POST /jobs/schedules takes one: the "
        "group's others are removed."
    )


class AppliedInfo(BaseModel):
    """What ``PUT /jobs/schedules?group=`` did (`AppliedSchedules.to_dict()`)."""

    group: str
    created: list[str]
    changed: list[str] = Field(
        description="Those whose task, schedule, kwargs or options differed."
    )
    removed: list[str] = Field(description="The group's schedules the set left out.")
    unchanged: int = Field(description="How many were already as given (untouched).")


MAX_SET_BODY = 64 * 1024 * 1024
"""The most bytes a set's body may take: 100,000 schedules of a few hundred bytes
each, with room to spare."""

Body = TypeVar("Body", NewSchedule, ScheduleChange, ScheduleSet)


_SCHEDULES = asked("schedules", 100)


def add_schedule_list(router: APIRouter, seam: Seam) -> None:
    """``GET /jobs/schedules``: add before ``/{name}``, which would take it."""

    @router.get(
        "/schedules",
        response_model=list[ScheduleInfo],
        summary="The schedules made at run time, a page at a time",
        description="With a store, as the store has them now: those this instance cannot "
        "run (known: false; `state=left_alone`) included. By name, 100 a page unless "
        "`limit` says (`limit=all`: every one); `X-Total-Count` says how many match, "
        '`Link: <...>; rel="next"` is the next page.',
        responses={
            422: {
                "description": "A bad `limit`, `cursor`, `state` or `q`: the detail says "
                "what to write."
            },
            503: {"description": "The store cannot be read: the detail says why."},
        },
    )
    async def list_schedules(
        request: Request, response: Response, ask: Annotated[Ask, Depends(_SCHEDULES)]
    ) -> list[ScheduleInfo]:
        try:
            stored = await seam.schedules()
        except StoreError as exc:
            fail(exc)
        kept = [s for s in stored if ask.wants(s.name)] if ask.q else stored
        if ask.state == "left_alone":
            kept = [s for s in kept if not s.known]
        elif ask.state is not None:
            # A state of the schedules this instance runs: their jobs' (the page's words).
            view = await (seam.cluster(()) if ask.state == "paused" else seam.unwell())
            named = set(seam.in_state(view, ask.state))
            kept = [s for s in kept if s.known and s.name in named]
        shown, after = ask.page(kept, _name)
        response.headers.update(headers(request, len(kept), after))
        return [ScheduleInfo.of(s) for s in shown]


def _name(stored: StoredSchedule) -> str:
    return stored.name


def add_schedule_changes(router: APIRouter, seam: Seam, bounds: ScheduleBounds) -> None:
    @router.post(
        "/schedules",
        status_code=201,
        response_model=ScheduleInfo,
        summary="Make a schedule at run time",
        openapi_extra=_body_schema(NewSchedule),
        responses={
            409: {"description": "A schedule has this name: change it instead."},
            **_BAD,
            **_STORE,
        },
    )
    async def add_schedule(request: Request) -> ScheduleInfo:
        body = await _read(request, NewSchedule)
        try:
            schedule = _schedule(body.schedule)
            bounds.check(body.name, schedule, body.options)
            made = await seam.add_schedule(
                body.name, body.task, schedule, body.kwargs, body.options
            )
        except (NameTakenError, TooManySchedulesError) as exc:
            raise HTTPException(409, str(exc)) from None
        except (ConfigurationError, StoreError) as exc:
            fail(exc)
        return ScheduleInfo.of(made)

    _add_set(router, seam, bounds)
    _add_change_and_removal(router, seam, bounds)


def _add_set(router: APIRouter, seam: Seam, bounds: ScheduleBounds) -> None:
    @router.put(
        "/schedules",
        response_model=AppliedInfo,
        summary="Apply a group's schedules as a set",
        description="Make the schedules of `group` exactly the body's, in one transaction: "
        "those missing are made, those that differ changed, the group's others removed, the "
        "rest left as they are. The same body again changes nothing.",
        openapi_extra=_body_schema(ScheduleSet),
        responses={
            409: {
                "description": "A name is a live schedule's outside the group, or the set "
                "would pass the scheduler's max_schedules: nothing was applied."
            },
            **_BAD,
            **_STORE,
        },
    )
    async def apply_schedules(request: Request, group: str) -> AppliedInfo:
        # `group` checked by the book (its 422 says the rule without echoing it).
        body = await read_json(request, ScheduleSet, MAX_SET_BODY, _example(ScheduleSet))
        wanted = []
        try:
            for index, item in enumerate(body.schedules):
                try:
                    schedule = _schedule(item.schedule)
                    bounds.check(item.name, schedule, item.options)
                except ConfigurationError as exc:
                    _refuse(f"schedules[{index}]: {exc}")
                options: Any = item.options  # checked by the book, as add_schedule's are
                wanted.append(ScheduleSpec(item.name, item.task, schedule, item.kwargs, options))
            applied = await seam.apply_schedules(group, wanted)
        except (NameTakenError, TooManySchedulesError) as exc:
            raise HTTPException(409, str(exc)) from None
        except (ConfigurationError, StoreError) as exc:
            fail(exc)
        return AppliedInfo.model_validate(applied.to_dict())


def _add_change_and_removal(router: APIRouter, seam: Seam, bounds: ScheduleBounds) -> None:
    @router.patch(
        "/schedules/{name}",
        response_model=ScheduleInfo,
        summary="Change a schedule made at run time",
        openapi_extra=_body_schema(ScheduleChange),
        responses={**_NOT_FOUND, **_BAD, **_STORE},
    )
    async def update_schedule(request: Request, name: str) -> ScheduleInfo:
        body = await _read(request, ScheduleChange)
        given = (body.task, body.schedule, body.kwargs)
        if all(part is None for part in given) and not body.options:
            _refuse("give at least one of task, schedule, kwargs, options")
        try:
            schedule = None if body.schedule is None else _schedule(body.schedule)
            bounds.check(name, schedule, body.options or {})
            changed = await seam.update_schedule(
                name,
                task=body.task,
                schedule=schedule,
                kwargs=body.kwargs,
                options=body.options or {},
            )
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            fail(exc)
        return ScheduleInfo.of(changed)

    @router.delete(
        "/schedules/{name}",
        status_code=204,
        response_class=Response,
        summary="Remove a schedule made at run time",
        responses={**_NOT_FOUND, **_STORE},
    )
    async def remove_schedule(name: str) -> Response:
        try:
            await seam.remove_schedule(name)
        except (JobNotFoundError, ConfigurationError, StoreError) as exc:
            fail(exc)
        return Response(status_code=204)


async def _read(request: Request, model: type[Body]) -> Body:
    """The body as ``model``, or a 415 or 422 saying what is wrong with it."""
    return await read_json(request, model, MAX_BODY, _example(model))


def _schedule(data: dict[str, Any]) -> Schedule:
    """The body's schedule; the parts it may leave out are the defaults."""
    if "every" in data:
        data = {"offset": 0, **data}
    elif "cron" in data:
        data = {"tz": "UTC", **data}
    return schedule_from(data)


def _refuse(detail: str) -> NoReturn:
    raise HTTPException(422, detail)


def _example(model: type[BaseModel]) -> str:
    if model is ScheduleSet:
        return (
            '{"schedules": [{"name": "acme-report", "task": "report", '
            '"schedule": {"every": 3600}}]}'
        )
    if model is NewSchedule:
        return (
            '{"name": "acme-report", "task": "report", "schedule": {"cron": "0 7 * * *", '
            '"tz": "Europe/Lisbon"}, "kwargs": {"tenant": "acme"}}'
        )
    return '{"schedule": {"every": 3600}}'


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI of a body read by hand (`_read`), as FastAPI would write it."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
