"""This process's memory of each job's last runs: ``GET /jobs/{name}/runs``
without a store (with one, claimed runs are in the store's history).

A job's history is a ring of its last ``keep`` runs. A run writes its figures
into arrays that the ring reuses: four floats into an ``array('d')``, and the
rest as a shared constant when the run was the usual one (ok, first try, by
the schedule). So recording a run allocates nothing that outlives it: keeping
each run's objects alive instead cost ~2 µs per run at 1,000 jobs a second
(fresh memory for every run, and the collector walking it), more than the
rest of a tick.
"""

from __future__ import annotations

from array import array

from ._status import ErrorInfo, Outcome, RunRecord, utc

__all__ = ["History"]

_Rest = tuple[Outcome, int, bool, str | None]  # outcome, attempts, manual, error
_USUAL: _Rest = ("ok", 1, False, None)


class History:
    """The last ``keep`` runs of one job."""

    __slots__ = ("_figures", "_keep", "_next", "_rest")

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._figures = array("d")  # seq, tick, started, duration: four per run
        self._rest: list[_Rest] = []
        self._next = 0  # the slot written next, once the ring is full

    def add(
        self,
        seq: int,
        tick: float,
        started: float,
        duration: float,
        outcome: Outcome,
        attempts: int,
        manual: bool,
        error: BaseException | None,
    ) -> None:
        rest: _Rest
        if outcome == "ok" and attempts == 1 and not manual and error is None:
            rest = _USUAL
        else:
            # An exception is kept as the status shows it: kept whole, it would
            # keep its traceback's frames (and their locals) alive.
            rest = (outcome, attempts, manual, None if error is None else str(ErrorInfo.of(error)))
        figures, rests = self._figures, self._rest
        if len(rests) < self._keep:
            figures.extend((seq, tick, started, duration))
            rests.append(rest)
            return
        slot = self._next
        at = 4 * slot
        figures[at], figures[at + 1], figures[at + 2], figures[at + 3] = (
            seq,
            tick,
            started,
            duration,
        )
        rests[slot] = rest
        self._next = (slot + 1) % self._keep

    def records(self, job: str, instance: str, limit: int) -> list[RunRecord]:
        """The runs, newest first, at most ``limit``."""
        figures = self._figures
        slots = sorted(range(len(self._rest)), key=lambda i: figures[4 * i], reverse=True)
        out = []
        for i in slots[:limit]:
            seq, tick, started, duration = figures[4 * i : 4 * i + 4]
            outcome, attempts, manual, error = self._rest[i]
            out.append(
                RunRecord(
                    id=f"{instance}#{int(seq)}",
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
