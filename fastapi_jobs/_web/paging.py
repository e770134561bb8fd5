"""A listing's page (``GET /jobs``, ``/jobs/schedules``, ``/jobs/{name}/runs``,
the status page): what was asked (``limit``, ``cursor``, ``state``, ``q``),
the rows of one page, and the headers that say how many rows match and where
the next page is.

The body stays a JSON list, as before pages: the page's facts travel in headers,
as GitHub's API sends them (``Link: <...>; rel="next"``, and a total in
``X-Total-Count``). The cursor is a keyset (the last row's name; for runs, its
place in the history), so a row added or removed between two pages moves no
other row from one page to the next; it is opaque (base64url), and says which
listing it is for, so one listing's cursor is refused by another. A bad value
is a 422 whose detail says what to write, without the value sent.
"""

from __future__ import annotations

import base64
import binascii
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, NoReturn, TypeVar

from fastapi import HTTPException, Query, Request

from .._checks import MAX_NAME
from .._status import FILTER_STATES

__all__ = ["MOST", "Ask", "asked", "headers", "matching"]

Row = TypeVar("Row")
Kind = Literal["jobs", "schedules", "runs"]

MOST = 1000
"""The most rows a page holds; ``limit=all`` asks for every row at once."""

_LIMIT = f"limit: write a whole number from 1 to {MOST}, or limit=all for every row"
_CURSOR = (
    'cursor: give the cursor of this listing\'s Link header (rel="next") as it came, '
    "or leave it out for the first page"
)
_STATE = f"state: write one of {', '.join(FILTER_STATES)}, or leave it out for every state"
_Q = f"q: write at most {MAX_NAME} characters of the names to find"


@dataclass(frozen=True, slots=True)
class Ask:
    """What a request asked of a listing."""

    kind: Kind
    limit: int | None
    """Rows a page holds; None: every row (``limit=all``)."""
    after: str | None
    """The cursor's key: the page starts after the row that has it."""
    state: str | None = None
    q: str = ""

    @classmethod
    def read(
        cls,
        kind: Kind,
        default: int,
        limit: str | None,
        cursor: str | None,
        state: str | None = None,
        q: str | None = None,
    ) -> Ask:
        """The query's values checked: a 422 that says what to write if one is
        bad. An empty value is as one left out (what a page's form sends)."""
        limit, cursor, state = limit or None, cursor or None, state or None
        if state is not None and state not in FILTER_STATES:
            _refuse(_STATE)
        if q is not None and len(q) > MAX_NAME:
            _refuse(_Q)
        return cls(kind, _limit(limit, default), _key(kind, cursor), state, q or "")

    def wants(self, name: str) -> bool:
        """Whether ``name`` holds ``q`` (ignoring case)."""
        return not self.q or self.q.casefold() in name.casefold()

    def page(
        self, rows: Sequence[Row], key: Callable[[Row], str | int]
    ) -> tuple[list[Row], str | None]:
        """The rows of this page, of ``rows`` ordered by ``key`` (names from the
        first; runs, whose key is their place in the history, from the newest),
        and the cursor of the next page (None: this is the last)."""
        start = 0
        if self.after is not None:
            if self.kind == "runs":
                # Newest first: the first run older than the cursor's.
                after = int(self.after)
                start = next((i for i, r in enumerate(rows) if int(key(r)) < after), len(rows))
            else:
                start = bisect_right(rows, self.after, key=key)  # type: ignore[arg-type]
        if self.limit is None or start + self.limit >= len(rows):
            return list(rows[start:]), None
        shown = list(rows[start : start + self.limit])
        return shown, cursor(self.kind, key(shown[-1]))


def matching(names: Iterable[str], ask: Ask) -> list[str]:
    """Of ``names``, those that hold ``q``, sorted: the rows of a listing's pages."""
    if not ask.q:
        return sorted(names)
    wanted = ask.q.casefold()
    return sorted(n for n in names if wanted in n.casefold())


def cursor(kind: Kind, key: str | int) -> str:
    """The cursor of the page after the row whose key is ``key``."""
    raw = f"{kind}:{key}".encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def headers(request: Request, total: int, after: str | None) -> dict[str, str]:
    """How many rows match (``X-Total-Count``), and the next page's address
    (``Link``, path-absolute: right behind a proxy that changes the host)."""
    found = {"X-Total-Count": str(total)}
    if after is not None:
        url = request.url.include_query_params(cursor=after)
        found["Link"] = f'<{url.path}?{url.query}>; rel="next"'
    return found


_Limit = Annotated[
    str | None,
    Query(
        description=f"Rows in the page, 1 to {MOST} (the endpoint's default if left out); "
        "`all`: every row, with no next page."
    ),
]
_Cursor = Annotated[
    str | None,
    Query(description='The next page: the cursor the `Link` header (rel="next") gave.'),
]
_State = Annotated[
    str | None,
    Query(
        description="Only the rows in this state: failing, paused, running, or left_alone "
        "(the stored schedules this instance cannot run)."
    ),
]
_Text = Annotated[str | None, Query(description="Only the names that hold this text (any case).")]


def asked(kind: Kind, default: int, *, filters: bool = True) -> Callable[..., Awaitable[Ask]]:
    """A route's dependency that reads a page's query: ``limit`` and ``cursor``;
    with ``filters``, ``state`` and ``q`` too. Each is read as text and checked
    here (not by FastAPI), so that a bad one is a 422 that echoes nothing.
    Coroutines: FastAPI would run a plain function in a worker thread."""
    if not filters:

        async def read_page(limit: _Limit = None, cursor: _Cursor = None) -> Ask:
            return Ask.read(kind, default, limit, cursor)

        return read_page

    async def read_filtered(
        limit: _Limit = None, cursor: _Cursor = None, state: _State = None, q: _Text = None
    ) -> Ask:
        return Ask.read(kind, default, limit, cursor, state, q)

    return read_filtered


def _limit(text: str | None, default: int) -> int | None:
    if text is None:
        return default
    if text == "all":
        return None
    # Its length first: int() of 5,000 digits raises (Python's bound on digits).
    if not (len(text) <= 4 and text.isascii() and text.isdigit() and 1 <= int(text) <= MOST):
        _refuse(_LIMIT)
    return int(text)


def _key(kind: Kind, text: str | None) -> str | None:
    if text is None:
        return None
    try:
        padded = text + "=" * (-len(text) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii")).decode()
    except (ValueError, UnicodeError, binascii.Error):
        _refuse(_CURSOR)
    said, sep, key = raw.partition(":")
    whole = len(key) <= 20 and key.isascii() and key.isdigit()  # "²" is a digit to isdigit()
    if said != kind or not sep or (kind == "runs" and not whole):
        _refuse(_CURSOR)
    return key


def _refuse(detail: str) -> NoReturn:
    raise HTTPException(422, detail)
