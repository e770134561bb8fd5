"""What the two routers share: an operation's error as its HTTP answer (or, for
a form of the status page, a redirect back that says what happened), a query
and a JSON body read and checked, and the paths of the routes in the app that
includes them."""

from __future__ import annotations

import codecs
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from email.message import Message
from email.utils import collapse_rfc2231_value
from types import UnionType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, Union, get_args, get_origin

from fastapi import HTTPException, Request, Response
from fastapi.dependencies.models import Dependant
from pydantic import BaseModel, ValidationError
from starlette.routing import NoMatchFound

from .._errors import (
    ConfigurationError,
    JobNotFoundError,
    JobRunningError,
    NotRunningError,
    StoreError,
    UnconfirmedError,
    short,
)
from .page import notice_url

if TYPE_CHECKING:
    from .._core.seam import Seam

__all__ = [
    "NOT_FOUND",
    "NO_STORE",
    "checked_query",
    "fail",
    "from_page",
    "path_of",
    "read_json",
    "state_said",
]

Model = TypeVar("Model", bound=BaseModel)

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No job has this name."}}
NO_STORE: dict[int | str, dict[str, Any]] = {
    503: {"description": "The store cannot be reached, or the app is stopping: nothing changed."}
}


# What the status page says of an operation's error (else: "unavailable").
_NOTICE_OF: tuple[tuple[type[Exception], str], ...] = (
    (UnconfirmedError, "unsure"),
    (JobNotFoundError, "unknown"),
    (JobRunningError, "running"),
    (ConfigurationError, "invalid"),
)


def fail(exc: Exception, page: str | None = None, name: str = "") -> NoReturn:
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


_STATE_SAID = {
    "running": "running",
    "never_started": "never started, so no job runs: the app did not run "
    "scheduler.lifespan; write FastAPI(lifespan=scheduler.lifespan)",
    "stopped": "stopped: the app is shutting down",
}


def state_said(seam: Seam) -> Callable[[Request, Response], Awaitable[None]]:
    """A dependency of both routers: the scheduler's state in the ``X-Scheduler``
    header of each JSON answer but an error's (a list has no room for it), and,
    the first time a request finds it never started, the log line that says
    why (`Seam.state`)."""

    async def say(request: Request, response: Response) -> None:
        state = seam.state(f"{request.method} {request.url.path}")
        response.headers["X-Scheduler"] = _STATE_SAID[state]

    return say


def path_of(request: Request, route: str, **params: str) -> str | None:
    """The path of one of our routes in this app (its prefixes and root path
    included), or None if the app does not have it."""
    try:
        return request.url_for(route, **params).path
    except NoMatchFound:
        return None


def from_page(request: Request) -> str | None:
    """The status page's path if ``request`` is one of its forms (a browser's
    navigation, which asks for HTML), else None: an API call gets JSON."""
    if "text/html" not in request.headers.get("accept", ""):
        return None
    return path_of(request, "fastapi_jobs_ui")


async def checked_query(request: Request) -> None:
    """A dependency of both routers, for each of their routes: a 422 for a query
    parameter given twice (FastAPI reads one of the values, the first or the
    last by the parameter's type: ``?group=a&group=b`` applied group b), or one
    the route does not take (``GET /jobs/{name}/runs?state=failing`` listed
    every run, as though it had filtered them). The parameters the app's own
    dependencies read are the route's too."""
    given = Counter(key for key, _ in request.query_params.multi_items())
    if not given:
        return
    found = _route_of(request)
    takes: dict[str, bool] = {}  # each parameter the route reads: whether it takes a list
    if found is not None:
        path, dependant = found
        takes = _query_names(dependant)
        for key in given:
            if key not in takes:
                listed = ", ".join(sorted(takes)) or "none"
                _unprocessable(
                    f"{short(key, 40)}: {request.method} {path} takes no such query "
                    f"parameter (it takes {listed}): leave it out"
                )
    for key, times in given.items():
        if times > 1 and not takes.get(key, False):
            _unprocessable(f"{short(key, 40)}: give it once; it came {times} times")


def _route_of(request: Request) -> tuple[str, Dependant] | None:
    """The request's route: its path (with the app's prefixes), and what it
    reads, the dependencies the app included our router with among them.
    FastAPI's older releases (0.110 here) copy the route for each inclusion
    (``scope["route"]``); newer ones (0.165) keep an inclusion's context, and
    ``scope["route"]`` is our router's own route. None if neither is found."""
    fastapi_scope = request.scope.get("fastapi")
    context = (
        fastapi_scope.get("effective_route_context") if isinstance(fastapi_scope, dict) else None
    )
    for owner in (context, request.scope.get("route")):
        path, dependant = getattr(owner, "path", None), getattr(owner, "dependant", None)
        if isinstance(path, str) and isinstance(dependant, Dependant):
            return path, dependant
    return None


def _query_names(dependant: Dependant) -> dict[str, bool]:
    """The query parameters a route reads (``dependant``: its own and its
    dependencies', the app's among them), by the names a client sends, each
    with whether it takes a list (``?tag=a&tag=b``: an app's, never ours)."""
    names: dict[str, bool] = {}
    todo = [dependant]
    while todo:
        current = todo.pop()
        for field in current.query_params:
            kind = field.field_info.annotation
            if isinstance(kind, type) and issubclass(kind, BaseModel):  # a Query() model
                for name, part in kind.model_fields.items():
                    names[part.alias or name] = _is_list(part.annotation)
            else:
                names[field.alias] = _is_list(kind)
        todo.extend(current.dependencies)
    return names


def _is_list(kind: Any) -> bool:
    """Whether a parameter of type ``kind`` takes several values (``list[str]``,
    ``tuple[int, ...] | None``, ...), as FastAPI reads them."""
    kinds = get_args(kind) if get_origin(kind) in (Union, UnionType) else (kind,)
    return any(
        get_origin(k) in (list, tuple, set, frozenset) or k in (list, tuple, set, frozenset)
        for k in kinds
    )


async def read_json(request: Request, model: type[Model], most: int, example: str) -> Model:
    """The request's body as ``model``: 415 unless it says it is JSON (a page
    elsewhere can post text/plain or a form with no preflight, never JSON) and
    is in UTF-8, 422 saying what is wrong with it (past ``most`` bytes, not
    JSON, not the model; ``example``: a body that works), never what was sent
    echoed whole."""
    kind, _, params = request.headers.get("content-type", "").partition(";")
    kind = kind.strip().lower()
    if kind != "application/json" and not (
        kind.startswith("application/") and kind.endswith("+json")
    ):
        got = repr(kind[:60]) if kind else "none"
        raise HTTPException(
            415, f"send the body as JSON, with Content-Type: application/json (got {got})"
        )
    charset = _charset(params)
    if charset not in (None, "utf-8", "utf8"):
        # JSON is UTF-8 (RFC 8259); a body in another charset would be read as
        # UTF-8, and fail as "not JSON" or arrive changed.
        raise HTTPException(
            415, f"send the body as JSON in UTF-8 (got charset={charset[:40]!r}); drop the charset"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > most:
            _unprocessable(f"the body takes more than {most} bytes: send e.g. {example}")
        chunks.append(chunk)
    text = _utf8(b"".join(chunks))
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        _unprocessable(f"the body is not JSON: send an object, e.g. {example}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        if not first["loc"]:
            _unprocessable(f"the body is not a JSON object: send e.g. {example}")
        where = ".".join(str(part) for part in first["loc"])
        if len(where) > 60:  # a key that was sent: never echoed whole
            where = f"{where[:60]}… ({len(where)} characters)"
        _unprocessable(f"{where}: {first['msg']} (send e.g. {example})")


# What a body begins with, when it is JSON in another encoding: a byte order
# mark (UTF-32's before UTF-16's, whose marks begin theirs), or the zero bytes
# that ASCII takes in UTF-16 and UTF-32 (RFC 4627's detection; JSON's first
# two characters are ASCII).
_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32 with a byte order mark"),
    (codecs.BOM_UTF32_BE, "UTF-32 with a byte order mark"),
    (codecs.BOM_UTF8, "UTF-8 with a byte order mark"),
    (codecs.BOM_UTF16_LE, "UTF-16 with a byte order mark"),
    (codecs.BOM_UTF16_BE, "UTF-16 with a byte order mark"),
)


def _utf8(body: bytes) -> str:
    """``body`` as text, if it is UTF-8 with no byte order mark, as JSON on the
    wire must be (RFC 8259); else a 415 that says what it is. The standard
    library's ``json.loads`` would read UTF-16 and UTF-32, and skip a mark: a
    body in those passed as JSON, and a client learned nothing."""
    found = next((said for mark, said in _BOMS if body.startswith(mark)), None)
    if found is None and b"\x00" in body[:4]:
        found = "UTF-16 or UTF-32"
    if found is None:
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            found = f"not UTF-8 from byte {exc.start}"
    raise HTTPException(
        415, f"send the body as JSON in UTF-8, with no byte order mark: it is {found}"
    )


def _charset(params: str) -> str | None:
    """The ``charset`` of a Content-Type's parameters (after the ``;``), lower
    case. The standard library's header parser reads them: a quoted value may
    hold a ``;`` (``x="a;charset=utf-16"`` names no charset)."""
    header = Message()
    header["content-type"] = f"application/json;{params}"
    charset = header.get_param("charset")
    if charset is None:
        return None
    return collapse_rfc2231_value(charset).lower()


def _unprocessable(detail: str) -> NoReturn:
    raise HTTPException(422, detail)
