"""What is shown of what users give: a schedule's kwargs wherever they show (a
listing, a repr, ``to_dict``, an error that quotes what it was given), and an
error's text on the status page and in the store.

A value under a name like a secret's (`SECRET_NAMES`) is hidden, and so is what
a database error quotes; text that is not text (a lone surrogate) is made
safe, so that one stored row cannot fail a listing. The jobs themselves get
the values as given, and the log has the jobs' own errors whole."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

__all__ = [
    "HIDDEN",
    "MAX_MESSAGE",
    "SECRET_NAMES",
    "error_line",
    "error_shown",
    "error_text",
    "hidden",
    "hide_secrets",
    "is_text",
    "masked_repr",
    "shown",
]


MAX_MESSAGE = 300
"""The longest error message kept in status and in the store."""
# What SQLAlchemy appends to a driver's message: the statement and its bound
# parameters (which may hold secrets), and a link.
# From the start of a run of spaces only (a run is taken at once): linear.
_SQL_PARTS = re.compile(r"(?<!\s)\s*+(?:\[SQL: |\[parameters: |\(Background on this error at: )")
# The modules whose errors come from a database: their first line may repeat a
# bound value ("invalid input syntax for type integer: "hunter2"", asyncpg's
# "invalid input for query argument $1: 'hunter2'"), so what they quote is hidden.
_DATABASE_MODULES = ("sqlalchemy", "asyncpg", "psycopg", "sqlite3", "aiosqlite")
# SQLAlchemy's prefix before the driver's message: "(module.Class) <class '...'>: ".
_WRAPPED = re.compile(r"^\([\w.]+\) (?:<class '[\w.]+'>: )?")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_ARGUMENT = re.compile(r"(query argument \$\d+: )[^(]*")


def _from_database(error: BaseException) -> bool:
    return any(kind.__module__.startswith(_DATABASE_MODULES) for kind in type(error).__mro__)


def _hide_values(line: str) -> str:
    """A database error's first line, its quoted (and asyncpg's argument) values
    hidden: the line says what went wrong, never with what."""
    line = _WRAPPED.sub("", line)
    line = _ARGUMENT.sub(r"\1… ", line)
    return _QUOTED.sub(lambda m: f"{m.group(0)[0]}…{m.group(0)[0]}", line)


def error_shown(error: BaseException) -> tuple[str, str]:
    """What of ``error`` may be shown, as its type's name and a message: a
    status page is read by more people than the log, and an error's text can
    carry data (SQLAlchemy appends the statement and its bound parameters,
    PostgreSQL a DETAIL line with the row's values, and the drivers repeat a
    value they refused in the first line: what a database error quotes is
    hidden)."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ is the job's, not ours
        text = "(its message could not be read)"
    line = text.partition("\n")[0]
    # Only the start of a long line is shown: only so much of it is read (a
    # message of a megabyte would hold the event loop), a URL cut in its
    # credentials hidden to the end.
    long = len(line) > _READ
    line = _OPEN_AUTHORITY.sub(HIDDEN, line[:_READ]) if long else line
    if _from_database(error):
        line = _hide_values(_SQL_PARTS.split(line, maxsplit=1)[0])
    # Any error may quote a URL or a setting (an HTTP client's, a broker's):
    # a URL's credentials and the value of a secret-like name are hidden.
    line = hide_secrets(line)
    cut = long or len(line) > MAX_MESSAGE
    line = _SQL_PARTS.split(line[:MAX_MESSAGE], maxsplit=1)[0]
    shown = "".join(c if c.isprintable() else " " for c in line).strip()
    if cut:
        shown = shown[: MAX_MESSAGE - 1] + "…"
    return type(error).__name__[:MAX_MESSAGE], shown


def hide_secrets(text: str) -> str:
    """``text`` with a URL's credentials hidden, and the value of every setting
    whose name holds a secret's word (``password=hunter2``, ``token: abc``,
    ``"api_key": "..."``, ``?api_key=abc``, ``Authorization: Bearer abc``,
    ``secret: [a, b]``): in one pass over the text, however long and whatever
    it holds."""
    text = _USERINFO.sub(HIDDEN + "@", text)
    parts: list[str] = []
    kept = at = 0
    while (word := _SECRET.search(text, at)) is not None:
        name_end = _NAME_REST.match(text, word.end()).end()  # type: ignore[union-attr]
        said = _SAID.match(text, name_end)
        if said is None:
            at = name_end  # a word that names no setting: on after its name
            continue
        start, end = _value(text, said.end())
        parts += (text[kept:start], HIDDEN)
        kept = at = end
    return "".join(parts) + text[kept:] if parts else text


def _value(text: str, start: int) -> tuple[int, int]:
    """Where the value of a setting that starts at ``start`` lies: a quoted one
    inside its quotes, a list or an object with its brackets, a word of an auth
    scheme (``Bearer``) with the credential after it, any other up to the first
    space or delimiter."""
    opening = text[start : start + 1]
    closing = _CLOSING.get(opening)
    if closing is not None:
        end = text.find(closing, start + 1)
        if opening in "[{":
            return start, len(text) if end < 0 else end + 1
        return start + 1, len(text) if end < 0 else end
    word = _VALUE.match(text, start)
    end = start if word is None else word.end()
    if text[start:end].lower() in _SCHEMES:
        credential = _CREDENTIAL.match(text, end)
        if credential is not None:
            end = credential.end()
    return start, end


def error_text(error: BaseException) -> str:
    """``error`` as shown, in one line (`error_shown`, then `error_line`): how
    the store and the history keep a run's error."""
    return error_line(*error_shown(error))


def error_line(kind: str, message: str) -> str:
    """An error shown as one line, ``Type: message``, as the store keeps it
    (``ErrorInfo.parse`` reads it back)."""
    return f"{kind}: {message}" if message else kind


def is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text that UTF-8 can carry (no lone surrogate)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def shown(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` as a listing shows them (the API, the page, the CLI): a value
    under a name like a secret's (``password``, ``token``, ``api_key``, ``dsn``,
    ``webhook_url``, at any depth), and the credentials of a URL, are `HIDDEN`,
    as a database error's quoted values are on the status page; and a lone
    surrogate that a row got some other way (written by hand, an older release)
    becomes U+FFFD, so that one row cannot fail the listing of every schedule."""
    masked: dict[str, Any] = _masked(kwargs)
    encoded = json.dumps(masked, ensure_ascii=False)
    if is_text(encoded):
        return masked
    # A str holds a character past U+FFFF as one code point: any surrogate is lone.
    fixed: dict[str, Any] = json.loads(_SURROGATE.sub("\ufffd", encoded))
    return fixed


HIDDEN = "[hidden]"
"""What a listing shows in place of a value under a name like a secret's."""

SECRET_NAMES = (
    "pass",
    "pwd",
    "secret",
    "token",
    "api_key",
    "auth",
    "credential",
    "private_key",
    "cookie",
    "session",
    "dsn",
    "webhook",
    "signature",
)
"""The words that make a name a secret's: a name holding one, in any case, has
its value hidden (``password``, ``client_secret``, ``Auth_Token``, ``db_dsn``).
An ``_`` in a word also matches ``-`` or nothing (``apiKey``, ``private-key``).
The HTTP reference lists them; a test holds the two lists equal."""

_WORDS = "|".join(re.escape(word).replace("_", "[-_]?") for word in SECRET_NAMES)
_SECRET = re.compile(_WORDS, re.IGNORECASE)
# The user:password@ of a URL, to its last @ (``redis://:p@ss@cache``); each
# part taken at once: linear, whatever the text holds.
_USERINFO = re.compile(r"(?<=://)(?:[^/\s@]*+@)++")
# A URL cut in its credentials, at the end of a line cut short.
_OPEN_AUTHORITY = re.compile(r"(?<=://)[^/\s]*+\Z")
_READ = 4 * 1024  # the characters of an error's first line read, at most
# A setting (`hide_secrets`): the rest of a name holding a secret's word, the
# ":" or "=" after it (the name quoted or not), then its value.
_NAME_REST = re.compile(r"[\w-]*+")
_SAID = re.compile(r"""["']?[ \t]*+[:=][ \t]*+""")
_VALUE = re.compile(r"""[^\s"',;&)}\]]*+""")
_CREDENTIAL = re.compile(r"[ \t]++[^\s\"',;&)}\]]++")
_CLOSING = {'"': '"', "'": "'", "[": "]", "{": "}"}
_SCHEMES = frozenset({"bearer", "basic", "digest", "token", "negotiate", "apikey", "key"})
_SURROGATE = re.compile("[\ud800-\udfff]")


def hidden(value: Any) -> Any:
    """``value`` with what its secret-like names hold hidden, as `shown` hides
    them, its lists, tuples and dicts copied: for a repr, or an error that
    quotes what it was given. A value too deep to walk (or holding itself) is
    hidden whole."""
    try:
        return _masked(value)
    except RecursionError:
        return HIDDEN


def masked_repr(obj: Any) -> str:
    """A dataclass's repr as the generated one writes it, with what its
    ``kwargs`` field holds `hidden`: a repr reaches tracebacks and logs."""
    parts = []
    for field in fields(obj):
        if field.repr:
            value = getattr(obj, field.name)
            if field.name == "kwargs":
                value = hidden(value)
            parts.append(f"{field.name}={value!r}")
    return f"{type(obj).__qualname__}({', '.join(parts)})"


def _masked(value: Any) -> Any:
    """``value`` (JSON, or a repr's lists, tuples and dicts) with what its
    secret-like names hold hidden."""
    if isinstance(value, Mapping):
        return {
            key: HIDDEN if isinstance(key, str) and _SECRET.search(key) else _masked(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_masked(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_masked(item) for item in value)
    if isinstance(value, str):
        # A URL's credentials, and a secret's setting in a text (a DSN's
        # ``password=...``, a URL's ``?token=...``), whatever the name it is under.
        return hide_secrets(value)
    return value
