"""Schedules applied as a set (`Scheduler.apply_schedules`): what a caller
gives (`ScheduleSpec`, one per schedule) and what it gets back (`AppliedSchedules`).

A group (a tenant, a source of imports) owns the schedules applied with its
name. Applying a set makes the group's live schedules exactly that set, in one
transaction: the missing ones made, the ones whose task or spec differs
changed (their version bumped), the ones not given removed, the rest left as
they are. So a deploy, or an admin's import, may apply the same set every time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError, short
from .._redaction import hidden, masked_repr
from .._schedules import Schedule
from .stored import ScheduleOptions, schedule_from

__all__ = ["AppliedSchedules", "ScheduleSpec"]


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """One schedule of a set given to `Scheduler.apply_schedules`: the arguments
    of `Scheduler.add_schedule`, as one value::

        ScheduleSpec("acme-report", "report", Cron("0 7 * * *"), kwargs={"tenant": "acme"})
    """

    name: str
    task: str | Callable[..., Any]
    """A function registered with `Scheduler.task`, or its name."""
    schedule: Schedule
    kwargs: Mapping[str, Any] | None = None
    options: ScheduleOptions | None = None
    """The job's options, as `Scheduler.add_schedule` takes them (None: none)."""

    @classmethod
    def from_dict(cls, data: object) -> ScheduleSpec:
        """One schedule as JSON says it (``POST /jobs/schedules``'s body):
        ``{"name": ..., "task": ..., "schedule": {"every": 3600} or {"cron":
        "0 7 * * *", "tz": "Europe/Lisbon"}, "kwargs": {...}, "options": {...}}``
        (``offset`` 0 and ``tz`` UTC if left out). `ConfigurationError` says
        what is wrong."""
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"{short(hidden(data))} is not a schedule: write {_EXAMPLE}")
        extra = sorted(str(key) for key in data if key not in _KEYS)
        if extra or not {"name", "task", "schedule"} <= data.keys():
            raise ConfigurationError(
                f"a schedule has the keys name, task, schedule, and optionally kwargs and "
                f"options{f' (not {short(extra[0])})' if extra else ''}: write {_EXAMPLE}"
            )
        when = data["schedule"]
        if isinstance(when, Mapping) and "every" in when:
            when = {"offset": 0, **when}
        elif isinstance(when, Mapping) and "cron" in when:
            when = {"tz": "UTC", **when}
        options = data.get("options") or {}
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"options {short(options)}: write a JSON object")
        given: Any = dict(options)  # checked, with the name, task and kwargs, as add_schedule's
        return cls(data["name"], data["task"], schedule_from(when), data.get("kwargs"), given)

    def __repr__(self) -> str:
        return masked_repr(self)  # kwargs hidden: a repr reaches tracebacks and logs


_KEYS = frozenset({"name", "task", "schedule", "kwargs", "options"})
_EXAMPLE = '{"name": "acme-report", "task": "report", "schedule": {"every": 3600}}'


@dataclass(frozen=True, slots=True)
class AppliedSchedules:
    """What `Scheduler.apply_schedules` did to the group's schedules, by name:
    ``created``, ``changed`` and ``removed`` are tuples of names (compare them
    with tuples: ``applied.created == ("report-acme",)``), ``unchanged`` a
    count; `to_dict` gives them as lists."""

    group: str
    created: tuple[str, ...]
    """The names made."""
    changed: tuple[str, ...]
    """Those whose task, schedule, kwargs or options differed (version bumped)."""
    removed: tuple[str, ...]
    """The group's schedules the set left out."""
    unchanged: int
    """How many were already as given (untouched: their versions kept)."""

    def to_dict(self) -> dict[str, Any]:
        """Its JSON form, as the API and the CLI show it."""
        return {
            "group": self.group,
            "created": list(self.created),
            "changed": list(self.changed),
            "removed": list(self.removed),
            "unchanged": self.unchanged,
        }
