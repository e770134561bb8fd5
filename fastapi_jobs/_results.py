"""How a run ended, in one place: one fact, `RunEnd`, and its views.

A run is the guarded run's (``_core.attempt``) to end: it makes the `RunEnd`
of each attempt, and the runner (``_core.runner``) folds a tick's retries into
one. Everything else that says how a run ended is a view of that one value,
made from it in one place each:

- `Ended` (`RunEnd.release`): the store's release of a claimed run;
- `RunResult` (`RunResult.of`): what ``run_now`` and a trigger's ``wait()``
  return;
- `fastapi_jobs.RunRecord` (``_core.history.History.add``): a run in this
  process's history (``GET /jobs/{name}/runs``; the store's history is made
  from `Ended`);
- `fastapi_jobs.BackfillTick` (``BackfillTick.of``): a backfill's tick.

The per-job counters a run moves live in `fastapi_jobs._status.JobStats`,
whose `ended` is their writer. Why a tick did not run (`SkipReason`) is here too.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

import anyio

from ._clock import as_datetime
from ._errors import LeaseLostError, RunReplacedError
from ._redaction import error_text

__all__ = ["Ended", "Manual", "Outcome", "RunEnd", "RunResult", "SkipReason", "lease_lost"]

_new = tuple.__new__

Outcome = Literal["ok", "failed", "timed_out", "cancelled"]
"""How a run ended. ``cancelled``: cut by shutdown (or by a lost lease)."""

SkipReason = Literal[
    "overlap",
    "missed",
    "claimed_elsewhere",
    "store_unavailable",
    "paused",
    "ahead_of_database",
    "schedule_changed",
]
"""Why a tick did not run here: ``overlap``, the previous run was still going
(or its thread, or the previous tick's claim was still on its way to the store);
``missed``, the loop woke too late (blocked loop, machine asleep, downtime) and
only the latest due tick ran; ``claimed_elsewhere``, another instance claimed
the tick (or still holds the previous one); ``store_unavailable``, the store
could not be reached, so the tick was skipped (fail closed); ``paused``, the
job was paused; ``ahead_of_database``, the tick, kept to run after the run
before it, was not yet due on the database's clock (stepped back) when it was
claimed; ``schedule_changed``, a stored schedule's tick was taken under a
version the store no longer has (changed or removed elsewhere, or here as its
claim went out), and the change did not keep it (no tick of the new version
at that instant, or the schedule removed). A tick due at its instant that the
database finds early is not skipped: it waits for the database's clock."""


class RunEnd(NamedTuple):
    """How one run (or a tick's runs, retries included) ended: the one fact
    that the views above are made from."""

    outcome: Outcome
    error: BaseException | None
    duration: float
    """Seconds from the first attempt's start to the last one's end."""
    started: float
    """When the first attempt started (the clock the job ticks on)."""
    attempts: int

    def release(self, job: str, fence: int, manual: bool, past: float | None) -> Ended:
        """The store's record of this run of ``job``'s claim ``fence``
        (``past``: a backfilled tick's, see `Ended.tick`)."""
        error = None if self.error is None else error_text(self.error)
        return _new(
            Ended,
            (job, fence, self.outcome, error, self.duration, self.attempts, manual, past),
        )


class Ended(NamedTuple):
    """How the run of one claim ended: what `Store.release` records."""

    job: str
    fence: int
    outcome: Outcome | None
    """How the run ended; None: its run never started (the app stopped first, or
    the claim came back after its caller gave up). Such a claim is only freed:
    no run is recorded, and the job's last run stays what it was."""
    error: str | None
    """The error as the status page shows it (``ErrorInfo``), or None."""
    duration: float
    """Seconds from the first attempt's start to the last one's end."""
    attempts: int = 1
    """Runs it took: 1, plus the retries."""
    manual: bool = False
    """Asked for by hand (trigger, the CLI), not by the schedule."""
    tick: float | None = None
    """The tick the run was for, when it is not the claim's ``last_tick`` (a
    backfilled tick older than the job's latest claim); None: the claim's."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `Scheduler.run_now` returns: how one run ended."""

    name: str
    outcome: Outcome
    tick: datetime
    duration_s: float
    error: BaseException | None
    """The exception of a failed run (a ``TimeoutError`` for a timed-out one)."""
    attempts: int = 1
    """Runs it took: 1, plus the retries."""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @classmethod
    def of(cls, name: str, tick: datetime, ran: RunEnd) -> RunResult:
        """What the caller of ``run_now`` or of a trigger sees of ``ran``."""
        return cls(
            name=name,
            outcome=ran.outcome,
            tick=tick,
            duration_s=ran.duration,
            error=ran.error,
            attempts=ran.attempts,
        )


class Manual:
    """A run asked for by hand (``Scheduler.trigger``), run by the job's task."""

    __slots__ = ("asked_from", "done", "past", "ran")

    def __init__(self, *, past: bool = False) -> None:
        self.past = past
        """A backfilled tick: older than its claim's ``last_tick``, so its release
        says the tick (``Ended.tick``)."""
        self.ran: RunEnd | None = None
        """How it ended; None until `done` (and for a cancelled run)."""
        self.done = anyio.Event()
        self.asked_from = contextvars.copy_context()
        """The caller's context (its request, its span), for the observers."""

    def result(self, name: str, tick: datetime) -> RunResult | None:
        """How the run ended, once `done`; None while it goes, and if it
        never ran to an end here (the app stopped first, or its lease was lost)."""
        ran = self.ran
        return None if ran is None else RunResult.of(name, tick, ran)


def replaced(tick: float) -> RunReplacedError:
    """The error a run cancelled by a newer tick is recorded with."""
    shown = as_datetime(tick).isoformat().replace("+00:00", "Z")
    return RunReplacedError(f"replaced by the tick at {shown} (overlap='replace')")


def lease_lost(reason: str, *, while_running: bool) -> LeaseLostError:
    """The error a job's status shows once its claim's lease is lost: why, and
    whether a run was cut (or only the retries that would have followed)."""
    if while_running:
        return LeaseLostError(f"lease lost: {reason}; the run was cancelled")
    return LeaseLostError(f"lease lost: {reason}; no more retries")
