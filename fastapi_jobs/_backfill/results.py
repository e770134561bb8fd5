"""What a backfill returns (`BackfillResult`), and how each of its ticks went
(`BackfillTick`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from .._redaction import error_text
from .._results import RunEnd

__all__ = ["BackfillResult", "BackfillTick", "TickOutcome"]

TickOutcome = Literal[
    "ok", "failed", "timed_out", "cancelled", "ran_already", "held", "not_run", "store_unavailable"
]
"""How one tick of a backfill went: a run's outcome (``ok``, ``failed``,
``timed_out``, ``cancelled``); ``ran_already``, the store's history has a run
of it (or it is the job's last tick claimed), so it was skipped; ``held``,
the job's lease stayed held elsewhere for a whole lease, so it was skipped;
``not_run``, the app stopped first (the backfill ends there);
``store_unavailable``, the store could not be reached (the backfill ends there)."""

_FAILED: tuple[TickOutcome, ...] = ("failed", "timed_out", "cancelled")


@dataclass(frozen=True, slots=True)
class BackfillTick:
    """How one tick of a backfill went."""

    tick: datetime
    outcome: TickOutcome
    duration_s: float | None
    """The run's length (retries included); None for a tick that did not run."""
    error: str | None
    """Why it failed, or did not run (as the status page says it), or None."""

    @classmethod
    def of(cls, tick: datetime, ran: RunEnd) -> BackfillTick:
        """How the run of ``tick`` went, as a backfill's tick (a view of the
        run's `fastapi_jobs._results.RunEnd`)."""
        error = None if ran.error is None else error_text(ran.error)
        return cls(tick, ran.outcome, ran.duration, error)

    def describe(self) -> str:
        """``ok 0.12s``, ``ran already``, ``failed: ValueError: ...``."""
        if self.outcome == "ok":
            return f"ok {self.duration_s or 0.0:.2f}s"
        if self.outcome == "ran_already":
            return "ran already"
        words = self.outcome.replace("_", " ")
        return words if self.error is None else f"{words}: {self.error}"


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What `Scheduler.backfill` returns: the range's ticks, and how each went."""

    job: str
    since: datetime
    until: datetime
    ticks: int
    """The job's ticks in the range (``since <= tick <= until``)."""
    ran: int
    """Ticks run to ``ok``."""
    failed: int
    """Ticks run that failed, timed out or were cancelled."""
    skipped_ran_already: int
    """Ticks skipped: they had run already (here or on another instance)."""
    skipped_held: int
    """Ticks skipped: the job's lease stayed held elsewhere."""
    outcomes: tuple[BackfillTick, ...]
    """Each tick reached, oldest first (fewer than `ticks` if it `stopped`)."""
    stopped: str | None = None
    """Why the backfill ended before its last tick (the app stopped, the store
    could not be reached), or None."""

    @property
    def ok(self) -> bool:
        """Every tick ran ok or had run already."""
        return (
            self.stopped is None
            and self.failed == 0
            and self.skipped_held == 0
            and len(self.outcomes) == self.ticks
        )

    @classmethod
    def of(
        cls,
        job: str,
        since: datetime,
        until: datetime,
        ticks: int,
        outcomes: Sequence[BackfillTick],
        stopped: str | None,
    ) -> BackfillResult:
        said = [t.outcome for t in outcomes]
        return cls(
            job=job,
            since=since,
            until=until,
            ticks=ticks,
            ran=said.count("ok"),
            failed=len([o for o in said if o in _FAILED]),
            skipped_ran_already=said.count("ran_already"),
            skipped_held=said.count("held"),
            outcomes=tuple(outcomes),
            stopped=stopped,
        )
