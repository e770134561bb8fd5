"""The counts of the jobs that left the scheduler, so that no counter goes down.

A stored schedule removed (or left alone here) takes its runner, and the
runner's counts, with it. Prometheus reads a counter that drops as a reset, and
counts what follows as new: a sum over the jobs that lost a job's 60 runs made
runs appear that never were, and fired the alert on failed runs. So each job
that leaves is folded:

* into ``parked``, one sum that the summed series add, however many jobs left;
* by name into ``remembered``, for the last ``REMEMBERED`` names that left: a
  job made again under its name counts on from there, so its own series comes
  back no lower than it went. While such a job lives, its earlier counts are
  ``carried``, never forgotten. Past ``REMEMBERED`` names, the oldest is
  forgotten, with its durations' cells: made again, it starts from 0, a reset
  that Prometheus counts right (what the new job ran).

A job that leaves with a run going is folded at once; what that run adds once
it ends is folded by `Ledger.sweep`, which each scrape and each job that
leaves calls. Everything here runs on the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from .._core.runner import JobRunner
from .._status import JobStats
from ._recorders import Recorder

__all__ = ["OUTCOMES", "REMEMBERED", "Counts", "Ledger"]

OUTCOMES = ("ok", "failed", "timed_out", "cancelled")

REMEMBERED = 10_000
"""The names of jobs that left whose counts are kept one by one (about 0.3 KiB
each), so that a job made again under one counts on from them."""


class Counts:
    """A job's counters as its series show them: runs by outcome (in the order
    of ``OUTCOMES``), skipped ticks by reason, retries started."""

    __slots__ = ("outcomes", "retries", "skipped")

    def __init__(self) -> None:
        self.outcomes = [0, 0, 0, 0]
        self.skipped: dict[str, int] = {}
        self.retries = 0

    @classmethod
    def of(cls, stats: JobStats) -> Counts:
        counts = cls()
        counts.add_stats(stats)
        return counts

    def add_stats(self, stats: JobStats) -> None:
        outcomes = self.outcomes
        outcomes[0] += stats.ok
        outcomes[1] += stats.failures - stats.timeouts
        outcomes[2] += stats.timeouts
        outcomes[3] += stats.cancelled
        if stats.skipped:
            skipped = self.skipped
            for reason, count in stats.skipped.items():
                skipped[reason] = skipped.get(reason, 0) + count
        self.retries += stats.retries

    def add(self, other: Counts) -> None:
        for k, count in enumerate(other.outcomes):
            self.outcomes[k] += count
        for reason, count in other.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + count
        self.retries += other.retries

    def less(self, earlier: Counts) -> Counts:
        """What was counted since ``earlier`` (counts only rise)."""
        since = Counts()
        since.outcomes = [
            now - then for now, then in zip(self.outcomes, earlier.outcomes, strict=True)
        ]
        since.skipped = {
            reason: count - earlier.skipped.get(reason, 0)
            for reason, count in self.skipped.items()
            if count != earlier.skipped.get(reason, 0)
        }
        since.retries = self.retries - earlier.retries
        return since

    def __bool__(self) -> bool:
        return any(self.outcomes) or bool(self.skipped) or bool(self.retries)


class Ledger:
    """What the jobs that left counted: ``parked`` (their sum), ``carried`` (by
    name, of the jobs made again under it) and ``remembered`` (by name, the
    last ``most`` names that left)."""

    def __init__(
        self, recorder: Recorder, live: Callable[[str], bool], most: int = REMEMBERED
    ) -> None:
        self.parked = Counts()
        self.carried: dict[str, Counts] = {}
        self.remembered: OrderedDict[str, Counts] = OrderedDict()
        self.most = most
        self._recorder = recorder
        self._live = live  # whether a job of this name runs here now
        self._leaving: list[tuple[JobRunner, Counts]] = []  # left with a run going

    def gone(self, runner: JobRunner) -> None:
        """``runner`` left the scheduler (as it left: the seam's ``on_leaving``)."""
        self.sweep()  # before its name may push theirs out
        counts = Counts.of(runner.stats)
        self._fold(runner.job.name, counts)
        if runner.busy:
            self._leaving.append((runner, counts))

    def sweep(self) -> None:
        """Fold what the runs still going as their jobs left counted, once they ended."""
        if not self._leaving:
            return
        going = []
        for runner, folded in self._leaving:
            if runner.busy:
                going.append((runner, folded))
            else:
                self._fold(runner.job.name, Counts.of(runner.stats).less(folded))
        self._leaving = going

    def earlier(self, name: str) -> Counts | None:
        """What the jobs of ``name`` that left counted, if they are kept."""
        earlier = self.carried.get(name)
        return self.remembered.get(name) if earlier is None else earlier

    def _fold(self, name: str, counts: Counts) -> None:
        earlier = self.carried.pop(name, None)
        if not counts and earlier is None:
            return  # nothing counted, nothing carried: nothing to keep
        self.parked.add(counts)
        if earlier is None:
            earlier = self.remembered.pop(name, None)
        if earlier is not None:
            earlier.add(counts)
            counts = earlier
        if self._live(name):  # made again already: its series counts on from these
            self.carried[name] = counts
            return
        self.remembered[name] = counts
        while len(self.remembered) > self.most:
            self._forget()

    def _forget(self) -> None:
        name, counts = self.remembered.popitem(last=False)
        if self._live(name):
            self.carried[name] = counts  # made again: kept while it lives
            return
        recorder = self._recorder
        recorder.durations.cells.pop(name, None)
        if recorder.lateness.by_job:
            recorder.lateness.cells.pop(name, None)
