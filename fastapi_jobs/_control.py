"""Operating jobs by hand: what a trigger returns, and the checks of what
operators pass (a pause's end, a history's length).

The operations themselves are `fastapi_jobs.Scheduler` methods
(``trigger``, ``pause``, ``resume``, ``runs``); the HTTP endpoints that call
them are in ``_web.status_routes``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ._checks import is_aware, is_whole
from ._clock import as_datetime
from ._errors import ConfigurationError, short
from ._results import Manual, RunResult

__all__ = ["MAX_RUNS", "TriggeredRun", "check_limit", "check_until"]

# The latest instant a datetime holds in UTC: a pause's end is shown as one.
_LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
MAX_RUNS = 1000
"""The most runs ``runs()`` / ``GET /jobs/{name}/runs`` return at once."""


@dataclass(frozen=True)
class TriggeredRun:
    """A run asked for with `Scheduler.trigger`: started, maybe not ended."""

    name: str
    id: str
    """The run's id in the history (``GET /jobs/{name}/runs``)."""
    tick: datetime
    """The instant the run was asked for (``ctx.tick``)."""
    instance: str
    """The instance that runs it."""
    _manual: Manual = field(repr=False, compare=False)
    _flush: Callable[[], Awaitable[None]] | None = field(default=None, repr=False, compare=False)
    """Sends the claims' releases now: a claimed run is in the store's history
    once `wait` returns."""

    @property
    def done(self) -> bool:
        return self._manual.done.is_set()

    async def wait(self) -> RunResult | None:
        """Wait for the run to end (and, with a store, to be recorded there):
        how it ended, or None if it never ran to an end here (the app stopped
        first, or its lease was lost)."""
        await self._manual.done.wait()
        if self._flush is not None:
            await self._flush()
        return self.result()

    def result(self) -> RunResult | None:
        """How the run ended, once `done` (None if it never ran to an end
        here); None while it goes."""
        return self._manual.result(self.name, self.tick)


def check_until(until: object, now: float) -> float | None:
    """A pause's end as POSIX seconds (None: until resumed), or why not."""
    if until is None:
        return None
    if not isinstance(until, datetime):
        raise ConfigurationError(
            f"until={short(until)}: pass an aware datetime (e.g. "
            "datetime.now(UTC) + timedelta(hours=2)), or None to pause until resumed"
        )
    if not is_aware(until):
        raise ConfigurationError(
            f"until={until.isoformat()} has no time zone: give one (UTC, e.g. "
            "2026-12-01T08:00:00Z, or an offset), so every instance reads it alike"
        )
    try:
        in_utc: datetime | None = until.astimezone(UTC)
    except OverflowError:  # before year 1 or after 9999 once in UTC: long past, or too far
        in_utc = datetime.min.replace(tzinfo=UTC) if until.year == 1 else None
    if in_utc is None or in_utc > _LATEST:
        raise ConfigurationError(
            f"until={until.isoformat()} is too far away: a pause's end is at most "
            f"{_LATEST.isoformat().replace('+00:00', 'Z')} (or pause until resumed: no until)"
        )
    ts = in_utc.timestamp()
    if ts <= now:
        shown = as_datetime(now).isoformat(timespec="seconds")
        raise ConfigurationError(
            f"until={until.isoformat()} is not in the future (now is {shown}): a pause's "
            "end must come after now; resume the job instead"
        )
    return ts


def check_limit(limit: object) -> int:
    if not is_whole(limit, 1, MAX_RUNS):
        raise ConfigurationError(
            f"limit={short(limit)}: must be a whole number from 1 to {MAX_RUNS}"
        )
    return limit
