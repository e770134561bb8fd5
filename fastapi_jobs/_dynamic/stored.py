"""Schedules as data: a stored schedule, its checks, and how it is written down.

A function is code (``Scheduler.task``); a schedule that names it is data: its
own name, an `Every` or a `Cron`, the keyword arguments each run passes the
function (JSON values), and the job's options. In a store it is one row of
``<prefix>schedules`` holding that as JSON (`encode`, `decode`): read back by
any instance, of this release or another, so only what JSON and the two
built-in schedules can say is taken.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, TypedDict
from zoneinfo import ZoneInfo

from .._checks import check_name, flag, is_whole, seconds
from .._clock import as_datetime
from .._context import JobContext
from .._errors import ConfigurationError, short
from .._policies import OVERLAPS
from .._redaction import is_text, masked_repr, shown
from .._schedules import Cron, Every, Schedule
from .._store import ScheduleRow

__all__ = [
    "MAX_SPEC",
    "ScheduleOptions",
    "StoredSchedule",
    "Task",
    "check_kwargs",
    "check_stored_options",
    "decode",
    "encode",
    "task_of",
]

MAX_SPEC = 65536
"""The most bytes a schedule's JSON (schedule, arguments, options) may take: it
is read by every instance at every change, and shown on the status."""


class ScheduleOptions(TypedDict, total=False):
    """The options a stored schedule takes: a declared job's (`JobOptions`)
    that JSON can say and that mean the same on every instance."""

    timeout: float | timedelta | None
    every_instance: bool
    catch_up: float | timedelta | None
    retries: int
    retry_backoff: float | timedelta
    retry_timeouts: bool
    paused: bool
    overlap: str
    jitter: float | timedelta | None


_OPTIONS = ScheduleOptions.__optional_keys__
_DURATIONS = ("timeout", "catch_up", "retry_backoff", "jitter")


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """A schedule made at run time (`Scheduler.add_schedule`), as this instance knows it."""

    name: str
    """Its name, which is also its job's (unique beside the declared jobs)."""
    task: str
    """The name of the function it runs (`Scheduler.task`)."""
    schedule: Schedule
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """What each run passes the function, as keyword arguments (JSON values)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The job's options it was given (durations in seconds)."""
    version: int = 0
    """Grows with each change; a run of the schedule is claimed only under the
    version the store has."""
    updated_at: datetime | None = None
    known: bool = True
    """Whether this instance runs it: it has the task, reads the spec, and the
    task takes the arguments (an older or newer release may not: it leaves the
    schedule alone)."""
    left_alone: str | None = None
    """Why this instance leaves it alone (its task missing, arguments its task
    does not take, a spec it cannot read, a declared job's name); None while it
    runs it."""
    group: str | None = None
    """The set it was applied with (`Scheduler.apply_schedules`); None: made by name."""

    def to_dict(self) -> dict[str, Any]:
        """Its JSON form, as the API and the CLI show it (``schedule`` None: a
        spec this release cannot read). In ``kwargs``, a value under a name like
        a secret's (``password``, ``api_key``, ``dsn``: the HTTP reference lists
        the words) and a URL's credentials are ``"[hidden]"``, as in its repr:
        what is shown reaches logs and screens. The values as given are in
        ``kwargs``, the field; write them back from there, not from this form."""
        try:
            data: dict[str, Any] | None = schedule_data(self.schedule)
        except ConfigurationError:
            data = None
        return {
            "name": self.name,
            "task": self.task,
            "schedule": data,
            "describe": self.schedule.describe(),
            "kwargs": shown(self.kwargs),
            "options": dict(self.options),
            "version": self.version,
            "updated_at": None
            if self.updated_at is None
            else self.updated_at.isoformat().replace("+00:00", "Z"),  # as the API's models
            "known": self.known,
            "left_alone": self.left_alone,
            "group": self.group,
        }

    def __repr__(self) -> str:
        return masked_repr(self)  # kwargs hidden, as in to_dict()


Task = Callable[..., Any]


def task_of(func: object, name: str | None) -> tuple[str, bool]:
    """A function that schedules may name: its name, and whether it takes the
    run's context first (as a job does)."""
    if not callable(func):
        raise ConfigurationError(f"task(): a task is a function (async or sync), got {short(func)}")
    if name is None:
        name = getattr(func, "__name__", None)
        if not name or name == "<lambda>":
            raise ConfigurationError(f"task(): cannot tell the name of {short(func)}: pass name=")
    name = check_name(name)
    if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
        raise ConfigurationError(f"task {name!r} is a generator function: use return, not yield")
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return name, False
    first = params[0] if params else None
    takes_context = (
        first is not None
        and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)
        and (first.annotation in (JobContext, "JobContext") or first.name == "ctx")
    )
    rest = params[1:] if takes_context else params
    positional = [p.name for p in rest if p.kind is p.POSITIONAL_ONLY]
    if positional:
        raise ConfigurationError(
            f"task {name!r}: parameter(s) {', '.join(positional)} are positional-only: a "
            "schedule passes its arguments by keyword"
        )
    return name, takes_context


def check_kwargs(task: str, func: Task, takes_context: bool, kwargs: object) -> dict[str, Any]:
    """``kwargs`` if ``func`` takes them (by keyword, after the context) and they
    are JSON values; as JSON gives them back (a tuple is a list)."""
    said = f"the schedule's kwargs for task {task!r}"
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        # Never the values themselves: a password among them would reach a 422 or a log.
        got = type(kwargs).__name__
        raise ConfigurationError(f"{said}: a {got}: pass a dict with string keys")
    if _flat_text(kwargs):
        # Strings, whole numbers, flags, None: JSON gives them back as they are
        # (a start checks 100,000 such schedules' arguments; the round trip
        # below costs ~10 µs).
        copied: Any = kwargs
    else:
        try:
            encoded = json.dumps(dict(kwargs), allow_nan=False, ensure_ascii=False)
            copied = json.loads(encoded)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ConfigurationError(f"{said}: not JSON values ({short(str(exc))})") from None
        if not is_text(encoded):
            # Valid JSON ("\ud800" escaped), but no UTF-8 text: stored, it would fail
            # every listing that shows it.
            raise ConfigurationError(
                f"{said}: a string holds a lone surrogate (such as \\ud800), which is not "
                "text: send valid Unicode"
            )
    if _depth(copied) > MAX_DEPTH:
        raise ConfigurationError(
            f"{said}: nested more than {MAX_DEPTH} levels deep: keep large data in the "
            "app's tables, and pass its key"
        )
    # The names are checked once per task and set of names (a start reads
    # 100,000 schedules of a few tasks; a signature costs ~25 µs).
    try:
        key = (task, func, takes_context, frozenset(copied))
        if key in _FITTING:
            return dict(copied)
    except TypeError:  # an unhashable callable: checked every time
        key = None
    _check_names(said, func, takes_context, copied)
    if key is not None:
        if len(_FITTING) >= _FITTING_MOST:
            _FITTING.clear()
        _FITTING.add(key)
    return dict(copied)


_FITTING: set[tuple[str, Task, bool, frozenset[str]]] = set()
"""The (task, function, context, argument names) that `check_kwargs` found fit."""
_FITTING_MOST = 4096


def _check_names(said: str, func: Task, takes_context: bool, copied: Mapping[str, Any]) -> None:
    """`ConfigurationError` unless ``func`` takes the arguments named in ``copied``."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    params = list(signature.parameters.values())
    if takes_context:
        context = params.pop(0).name
        if context in copied:
            raise ConfigurationError(
                f"{said}: {context!r} is the run's context, which the scheduler passes"
            )
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(copied) - names) if not accepts_any else []
    if unknown:
        raise ConfigurationError(
            f"{said}: it takes no argument {short(unknown[0])} "
            f"(it takes {', '.join(sorted(names)) or 'none'})"
        )
    missing = [
        p.name
        for p in params
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in copied
    ]
    if missing:
        raise ConfigurationError(f"{said}: it needs the argument(s) {', '.join(missing)}")


_EMPTY: Mapping[str, Any] = MappingProxyType({})

MAX_DEPTH = 32
"""The deepest nesting of a schedule's arguments (lists and objects in one
another): JSON's own readers and the status's serializer stop far below
Python's recursion limit, past which a stored schedule could not be shown."""


_SCALARS = (str, int, bool, type(None))


def _flat_text(kwargs: Mapping[Any, Any]) -> bool:
    """Whether ``kwargs`` is a dict of text keys and scalar values that JSON
    keeps as they are: strings (no lone surrogate), ints, flags, None."""
    return type(kwargs) is dict and all(
        type(k) is str and type(v) in _SCALARS and (type(v) is not str or is_text(v)) and is_text(k)
        for k, v in kwargs.items()
    )


def _depth(value: object) -> int:
    """How deep lists and dicts nest in ``value`` (a JSON value), without recursion."""
    if type(value) is dict and all(type(v) in _SCALARS for v in value.values()):
        return 1  # the common case, without the walk
    deepest, level = 0, [(value, 1)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                return depth
            children = item.values() if isinstance(item, dict) else item
            level.extend((child, depth + 1) for child in children)
    return deepest


def check_stored_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as a stored schedule keeps them (durations in seconds), each
    checked; the job's own checks (`Job.build`) run when it is made."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"schedule {name!r}: {short(unknown[0])} is not an option of a stored schedule "
            f"(they are {', '.join(sorted(_OPTIONS))})"
        )
    said = f"schedule {name!r}: "
    kept: dict[str, Any] = {}
    for key, value in options.items():
        if key in _DURATIONS:
            if value is not None or key == "retry_backoff":
                value = seconds(key, value, context=said, allow_zero=key == "retry_backoff")
        elif key in ("every_instance", "retry_timeouts", "paused"):
            value = flag(key, value, context=said)
        elif key == "retries" and not is_whole(value):
            raise ConfigurationError(f"{said}retries={short(value)}: pass a whole number")
        elif key == "overlap" and value not in OVERLAPS:
            raise ConfigurationError(
                f"{said}overlap={short(value)}: pass one of {', '.join(map(repr, OVERLAPS))}"
            )
        kept[key] = value
    return kept


_HOSTS_OWN = frozenset({"localtime", "posixrules", "Factory"})
"""Names in a host's zone files that are not a zone of their own: each host's
may differ (``localtime`` links to the machine's zone)."""


def schedule_data(schedule: Schedule) -> dict[str, Any]:
    """``schedule`` as JSON: an `Every` or a `Cron` in a named zone."""
    if type(schedule) is Every:
        return {
            "every": schedule.period_us / 1_000_000,
            "offset": schedule.offset.total_seconds(),
        }
    if type(schedule) is Cron:
        zone = "UTC" if schedule.tz is UTC else getattr(schedule.tz, "key", None)
        if zone in _HOSTS_OWN:
            raise ConfigurationError(
                f"tz={zone!r} is this host's own zone, which another host may not share: "
                "pass the zone's IANA name, such as 'Europe/Lisbon' or 'UTC'"
            )
        if not isinstance(schedule.tz, ZoneInfo | type(UTC)) or zone is None:
            raise ConfigurationError(
                f"a stored cron schedule needs a named timezone (tz='Europe/Lisbon'), "
                f"not {short(schedule.tz)}: every instance must read the same zone back"
            )
        return {"cron": schedule.expr, "tz": zone}
    raise ConfigurationError(
        f"a stored schedule is Every(...) or Cron(...), not {short(schedule)}: "
        "a schedule of your own class is code; declare its job instead"
    )


def schedule_from(data: object) -> Schedule:
    """`schedule_data`'s JSON read back; `ConfigurationError` if it is not one.
    One object per distinct schedule: schedules are immutable, and 100,000
    stored ones share a few (each made anew cost ~20 µs and ~100 bytes)."""
    try:
        # The types in the key: True == 1, but Every(seconds=True) is refused.
        key = tuple((k, type(v), v) for k, v in sorted(data.items()))  # type: ignore[attr-defined]
        return _SCHEDULES[key]
    except (AttributeError, TypeError):  # not a dict, or an unhashable value
        return _schedule_from(data)
    except KeyError:
        pass
    schedule = _schedule_from(data)
    if len(_SCHEDULES) >= _SCHEDULES_MOST:
        _SCHEDULES.clear()
    _SCHEDULES[key] = schedule
    return schedule


_SCHEDULES: dict[tuple[tuple[str, type, object], ...], Schedule] = {}
_SCHEDULES_MOST = 4096


def _schedule_from(data: object) -> Schedule:
    if isinstance(data, Mapping) and set(data) == {"every", "offset"}:
        return Every(seconds=data["every"], offset=data["offset"])
    if isinstance(data, Mapping) and set(data) == {"cron", "tz"}:
        return Cron(data["cron"], tz=data["tz"])
    raise ConfigurationError(
        f"schedule {short(data)}: write {{'every': seconds, 'offset': seconds}} or "
        "{'cron': '0 7 * * *', 'tz': 'UTC'}"
    )


def encode(schedule: Schedule, kwargs: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """The spec a store keeps: one JSON object, at most ``MAX_SPEC`` bytes."""
    text = json.dumps(
        {"schedule": schedule_data(schedule), "kwargs": kwargs, "options": options},
        allow_nan=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    if len(text.encode()) > MAX_SPEC:
        raise ConfigurationError(
            f"the schedule's arguments and options take {len(text.encode())} bytes as JSON; "
            f"the most is {MAX_SPEC}: keep large data in the app's tables, and pass its key"
        )
    return text


def decode(row: ScheduleRow, known: bool) -> StoredSchedule:
    """A row read back; `ConfigurationError` if its spec is not one this
    release can read (written by a newer one, or by hand)."""
    try:
        data = json.loads(row.spec)
    except ValueError:
        raise ConfigurationError(f"schedule {row.name!r}: its spec is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("kwargs"), dict):
        raise ConfigurationError(f"schedule {row.name!r}: its spec lacks its kwargs")
    if _depth(data["kwargs"]) > MAX_DEPTH:
        raise ConfigurationError(f"schedule {row.name!r}: its kwargs nest too deep")
    options = data.get("options")
    kept = check_stored_options(row.name, options) if options and isinstance(options, dict) else {}
    return StoredSchedule(
        name=row.name,
        task=sys.intern(row.task),  # a few tasks, named by 100,000 rows: one string each
        schedule=schedule_from(data.get("schedule")),
        # An empty one shared: 10,000 schedules without options keep no dict each.
        kwargs=data["kwargs"] or _EMPTY,
        options=kept or _EMPTY,
        version=row.version,
        updated_at=as_datetime(row.updated_at) if math.isfinite(row.updated_at) else None,
        known=known,
        group=row.group,
    )
