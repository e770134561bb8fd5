"""Errors raised by fastapi_jobs.

The hierarchy::

    FastAPIJobsError
    ├── ConfigurationError      bad declaration: caught when the job is declared
    │   └── NameTakenError      a schedule made under a name a live schedule has
    ├── JobNotFoundError        a job name the scheduler does not know
    ├── JobRunningError         asked to run a job that is already running
    ├── LeaseLostError          a run's claim was lost (taken over, or not renewed)
    ├── NotRunningError         asked to trigger a job while the scheduler is not running
    ├── ScheduleChangedError    a stored schedule's tick claimed under a version since replaced
    ├── TooManySchedulesError   a schedule past the most the scheduler keeps (max_schedules)
    └── StoreError              the store cannot be used as configured
        └── UnconfirmedError    a change went to the store, whose answer did not come back
"""

from __future__ import annotations

from datetime import datetime

from ._clock import as_datetime

__all__ = [
    "ConfigurationError",
    "FastAPIJobsError",
    "JobNotFoundError",
    "JobRunningError",
    "LeaseLostError",
    "NameTakenError",
    "NotRunningError",
    "ScheduleChangedError",
    "StoreError",
    "TickAheadError",
    "TooManySchedulesError",
    "UnconfirmedError",
    "short",
]


_LISTED = 20


class FastAPIJobsError(Exception):
    """Base class of every error fastapi_jobs raises."""


class ConfigurationError(FastAPIJobsError, ValueError):
    """Raised when a job, a schedule or the scheduler is declared wrongly."""


class NameTakenError(ConfigurationError):
    """Raised when a schedule is made under the name of a live schedule (the
    control router answers 409: change that one instead)."""


class JobNotFoundError(FastAPIJobsError, LookupError):
    """Raised when a job name is not registered with the scheduler."""

    def __init__(self, name: str, known: list[str], *, kind: str = "job") -> None:
        self.name = name
        # Both go into a 404 body: never echo a huge name, nor list 10,000 jobs.
        listing = ", ".join(repr(k) for k in known[:_LISTED]) or "none"
        if len(known) > _LISTED:
            listing += f" and {len(known) - _LISTED} more"
        super().__init__(f"no {kind} named {short(name)}; the {kind}s are: {listing}")


class JobRunningError(FastAPIJobsError):
    """Raised when a job is asked to run now while a run of it is still going."""

    def __init__(
        self,
        name: str,
        started_at: datetime | None = None,
        instance: str | None = None,
        *,
        message: str | None = None,
    ) -> None:
        self.name = name
        self.started_at = started_at
        """When the run going started, if known."""
        self.instance = instance
        """The instance running it, if known (with a store)."""
        where = "" if instance is None else f" on {instance}"
        since = "" if started_at is None else f" since {started_at.isoformat(timespec='seconds')}"
        super().__init__(
            message
            or f"job {name!r} is running{where}{since}; wait for the run to finish and ask again"
        )


class LeaseLostError(FastAPIJobsError):
    """Raised (and recorded) when a run's claim is no longer held by this instance."""


class RunReplacedError(FastAPIJobsError):
    """Recorded for a run cancelled because a newer tick of its job came while it
    went, and the job's ``overlap`` is ``"replace"``."""


class NotRunningError(FastAPIJobsError, RuntimeError):
    """Raised when a job is triggered while the scheduler is not running (or stopping)."""


class TooManySchedulesError(FastAPIJobsError):
    """Raised when making schedules would take the live ones past
    ``Scheduler(max_schedules=)``: nothing was made (the control router answers 409)."""

    def __init__(self, live: int, asked: int, most: int) -> None:
        self.live, self.asked, self.most = live, asked, most
        super().__init__(
            f"{live} schedule(s) are live and this would make {asked} more; the most is "
            f"{most} (Scheduler(max_schedules=)): remove some, or raise the bound"
        )


class StoreError(FastAPIJobsError):
    """Raised when a store cannot be used as configured (wrong database, missing table)."""


class TickAheadError(FastAPIJobsError):
    """A store's answer to the claim of a tick that is still in the future on the
    database's clock (its value in `Store.claim`'s result): nothing was claimed.
    The scheduler's estimate of the database's clock was off (the database's
    clock was stepped back, or this host's forward): it takes ``db_time`` as the
    database's reading and claims the tick again when the database reaches it."""

    def __init__(self, tick: float, db_time: float) -> None:
        super().__init__(
            f"its tick {_instant(tick)} is {tick - db_time:.3f}s ahead of the database's "
            f"clock ({_instant(db_time)}): not claimed yet"
        )
        self.tick = tick
        """The tick asked for (POSIX seconds)."""
        self.db_time = db_time
        """The database's clock as it refused the claim (POSIX seconds)."""


class ScheduleChangedError(FastAPIJobsError):
    """A store's answer to the claim of a stored schedule's tick made under a
    version of the schedule that the store no longer has (changed or removed on
    another instance since this one read it; its value in `Store.claim`'s
    result): nothing was claimed. The scheduler reads the change at once, and
    runs the tick under the new version if the change kept it."""

    def __init__(self, tick: float) -> None:
        super().__init__(
            f"its schedule changed since this instance read it: the tick {_instant(tick)} "
            "is not claimed under the old version"
        )
        self.tick = tick
        """The tick asked for (POSIX seconds)."""


class UnconfirmedError(StoreError):
    """Raised when a change (a pause, a resume) went to the store but its answer
    did not come back in time: it may have been made, and the next reading of the
    store (``GET /jobs/{name}``) shows whether it was."""


def _instant(ts: float) -> str:
    """``ts`` as a UTC time for people; as a number if it is none (a store of
    one's own may say anything)."""
    try:
        return as_datetime(ts).isoformat()
    except (ValueError, OverflowError, OSError, TypeError):
        return repr(ts)


def short(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters: error messages echo
    what they were given, and what they were given may be huge or hostile."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails is shown as such
        return f"<{type(value).__name__} with a failing repr>"
    if len(text) <= limit:
        return text
    # The length of what was given (a string's own, not its repr's quotes).
    size = len(value) if isinstance(value, str | bytes) else len(text)
    return f"{text[:limit]}… ({size} characters)"
