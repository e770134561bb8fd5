"""This process's memory of each job's last runs: ``GET /jobs/{name}/runs``
without a store (with one, claimed runs are in the store's history).

A job's history is a ring of its last ``keep`` runs, kept as three floats per
run in one ``array('d')`` (tick, start, duration); the outcome, attempts and
error are kept aside only for the runs that were not the usual one (ok, at the
first try, by the schedule). Recording a run writes three floats into memory
the ring already has: keeping an object per run alive instead (a record, its
floats, its list slot) cost ~2 µs per run at 1,000 jobs a second, a third of
a tick, in fresh memory and in the collector's walks.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from .._redaction import error_text
from .._status import ErrorInfo, Outcome, RunRecord, utc

if TYPE_CHECKING:
    from .._results import RunEnd

__all__ = ["History", "run_id"]

_Rest = tuple[Outcome, int, bool, str | None]  # outcome, attempts, manual, error
_USUAL: _Rest = ("ok", 1, False, None)
_FIRST = 4  # runs the ring has room for at first; doubled up to `keep`
# Rooms are made by repeating this: an array grown in place (``frombytes``)
# keeps a sixteenth more and 3 to 7 floats of spare room (24 B a job at first,
# 128 once it holds 50 runs); a repeat or a sum is made to measure.
_ZERO = array("d", (0.0,))


def run_id(instance: str, n: int, fence: int | None) -> str:
    """A run's id: its claim's fence with a store, else ``instance#n`` (the n-th
    run of the job this process recorded)."""
    return str(fence) if fence is not None else f"{instance}#{n}"


class History:
    """The last ``keep`` runs of one job."""

    # Kept small: one per job that ran (its room is len(_figures) // 3).
    __slots__ = ("_figures", "_keep", "_unusual", "count")

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._figures = _ZERO * (3 * min(_FIRST, keep))
        self._unusual: dict[int, _Rest] | None = None  # by slot; made when first needed
        self.count = 0
        """Runs recorded so far: the number of the next one."""

    def add(self, tick: float, ran: RunEnd, manual: bool) -> None:
        """Record the run of ``tick`` that ended as ``ran``."""
        outcome, error, duration, started, attempts = ran
        n = self.count
        self.count = n + 1
        figures = self._figures
        if n < self._keep and 3 * n == len(figures):  # full before the ring is: more room
            figures = self._figures = figures + _ZERO * (3 * (min(2 * n, self._keep) - n))
        slot = n % self._keep
        at = 3 * slot
        figures[at], figures[at + 1], figures[at + 2] = tick, started, duration
        unusual = self._unusual
        if outcome == "ok" and attempts == 1 and not manual and error is None:
            if unusual:
                unusual.pop(slot, None)
            return
        if unusual is None:
            unusual = self._unusual = {}
        # An exception is kept as the status shows it: kept whole, it would
        # keep its traceback's frames (and their locals) alive.
        shown = None if error is None else error_text(error)
        unusual[slot] = (outcome, attempts, manual, shown)

    def records(self, job: str, instance: str, limit: int) -> list[RunRecord]:
        """The runs, newest first, at most ``limit``; ids are ``instance#n``."""
        figures, keep = self._figures, self._keep
        out = []
        for n in range(self.count - 1, max(-1, self.count - 1 - min(limit, keep)), -1):
            slot = n % keep
            tick, started, duration = figures[3 * slot : 3 * slot + 3]
            outcome, attempts, manual, error = (self._unusual or {}).get(slot, _USUAL)
            out.append(
                RunRecord(
                    id=run_id(instance, n, None),
                    job=job,
                    tick=utc(tick),
                    manual=manual,
                    attempts=attempts,
                    started_at=utc(started),
                    finished_at=utc(started + duration),
                    duration_s=duration,
                    outcome=outcome,
                    error=ErrorInfo.parse(error),
                    instance=instance,
                    fence=None,
                )
            )
        return out
