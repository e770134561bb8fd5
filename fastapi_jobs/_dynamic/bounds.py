"""What a schedule made or changed over HTTP may ask: `ScheduleBounds`.

Code that calls `Scheduler.add_schedule` is the app's own, and may ask what it
likes. A body posted to ``/jobs/schedules`` is a web form's: an operator's
typo (``every 0.001``), a six-field cron that fires every second, or a
``catch_up`` of 1e300 would be stored for every instance to run. The control
router checks each body against its bounds, before the store sees it.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeGuard

from .._checks import is_whole, seconds
from .._errors import ConfigurationError
from .._schedules import Schedule

__all__ = ["DURATION_OPTIONS", "ScheduleBounds"]

DURATION_OPTIONS = ("timeout", "catch_up", "retry_backoff", "jitter")
"""The options of a stored schedule that are durations, in seconds."""

_SAMPLED = 64  # ticks looked at for the shortest gap between two


@dataclass(frozen=True, slots=True)
class ScheduleBounds:
    """The bounds of a schedule made or changed over HTTP (the control router's
    ``bounds=``): ``shortest``, the least time between two of its ticks
    (default 10 s: a job every second belongs in code); ``longest``, the most any of its
    durations may be (``timeout``, ``catch_up``, ``retry_backoff``, ``jitter``;
    default a week); ``most_retries`` (default 10). A body past one is a 422
    that names the bound.

    ```python
    # fragment: an app whose operators may make schedules every 10 seconds
    router = scheduler.control_router(
        dependencies=[Depends(require_admin)],
        bounds=ScheduleBounds(shortest=timedelta(seconds=10)),
    )
    ```
    """

    shortest: float | timedelta = 10.0
    longest: float | timedelta = timedelta(days=7)
    most_retries: int = 10

    def __post_init__(self) -> None:
        said = "ScheduleBounds: "
        shortest = seconds("shortest", self.shortest, context=said, allow_zero=True)
        longest = seconds("longest", self.longest, context=said, allow_zero=True)
        retries = self.most_retries
        if not is_whole(retries, 0):
            raise ConfigurationError(
                f"ScheduleBounds(most_retries={retries!r}): pass a whole number >= 0"
            )
        object.__setattr__(self, "shortest", shortest)
        object.__setattr__(self, "longest", longest)

    def check(self, name: str, schedule: Schedule | None, options: Mapping[str, Any]) -> None:
        """`ConfigurationError` if ``schedule`` or ``options`` (of the schedule
        ``name``; either may be left out of a change) pass a bound."""
        assert isinstance(self.shortest, float) and isinstance(self.longest, float)
        if schedule is not None:
            gap = _shortest_gap(schedule)
            if gap < self.shortest:
                raise ConfigurationError(
                    f"schedule {name!r}: {schedule.describe()} runs {gap:.3g}s apart, and a "
                    f"schedule made over HTTP runs at least {self.shortest:g}s apart (the "
                    "app's ScheduleBounds(shortest=...) sets it)"
                )
        for option in DURATION_OPTIONS:
            value = options.get(option)
            # `not <=`: NaN is past every bound too.
            if _number(value) and not value <= self.longest:
                raise ConfigurationError(
                    f"schedule {name!r}: {option}={value:g}s is longer than the "
                    f"{self.longest:g}s a schedule made over HTTP may ask (the app's "
                    "ScheduleBounds(longest=...) sets it)"
                )
        retries = options.get("retries")
        if _number(retries) and retries > self.most_retries:
            raise ConfigurationError(
                f"schedule {name!r}: retries={retries:g} is more than the "
                f"{self.most_retries} a schedule made over HTTP may ask (the app's "
                "ScheduleBounds(most_retries=...) sets it)"
            )


def _shortest_gap(schedule: Schedule) -> float:
    """The least time between two of the next ticks of ``schedule`` (inf if it
    has fewer than two): an interval's own, or a cron's over its next ticks."""
    ticks: list[float] = []
    at = time.time()
    for _ in range(_SAMPLED):
        try:
            at = schedule.next_after(at)
        except (ValueError, OverflowError):
            break
        if not math.isfinite(at):
            break
        ticks.append(at)
    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
    return min(gaps, default=math.inf)


def _number(value: object) -> TypeGuard[float]:
    """A JSON number (the other checks of the options say what else is wrong)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
