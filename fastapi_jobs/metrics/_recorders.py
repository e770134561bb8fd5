"""The observers that count what the scheduler's own counters do not: each
run's duration and lateness (and, in prometheus_client's multiprocess mode,
everything this process counts, into its files)."""

from __future__ import annotations

from array import array
from bisect import bisect_left

from prometheus_client import Counter, Gauge, Histogram, Summary

from .._core.observers import RunFinished, RunStarted, TickSkipped
from ._sinks import PREFIX

__all__ = ["DURATION_BUCKETS", "LATENESS_BUCKETS", "Counting", "Recorder", "Series"]

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""Seconds: jobs run from milliseconds (a cleanup) to an hour (a report).
The buckets of ``run_duration_seconds`` with ``histograms_by_job=True``."""
LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30)
"""Seconds from a tick to its run's start: milliseconds when healthy."""
DURATIONS = (PREFIX + "run_duration_seconds", "How long each run (attempt) took.")
LATENESS = (
    PREFIX + "run_lateness_seconds",
    "From a tick to the start of its run (scheduled first attempts).",
)


def lateness(event: RunFinished) -> float | None:
    """From the tick to the run's start, for a scheduled first attempt (a retry
    or a run by hand starts when it starts, not late)."""
    if event.attempt != 1 or event.manual:
        return None
    late = event.started - event.tick
    return late if late > 0 else 0.0


class Series:
    """A histogram (or, with no bounds, a summary: sum and count) by job or for
    the whole process, kept as plain arrays: an observation is a bisect and two
    additions. (prometheus_client's ``Histogram`` takes a lock for the bucket
    and one for the sum: +7 µs a run for two histograms.)"""

    __slots__ = ("bounds", "by_job", "cells", "edges", "total")

    def __init__(self, bounds: tuple[float, ...], *, by_job: bool) -> None:
        self.bounds, self.by_job = bounds, by_job
        self.edges = (*(repr(float(bound)) for bound in bounds), "+Inf")
        # Per job ("" for the process): a count per bucket (the last one +Inf), then the sum.
        self.cells: dict[str, array[float]] = {}
        # By job: the sum of every job's cells ever, those of jobs gone too: what
        # the summed series show, which never go down as jobs come and go. (Not
        # by job, the process's one series is its own total: this one is unused.)
        self.total = self._empty()

    def made(self, job: str) -> array[float]:
        """The cells of ``job`` (of the process if not by job), made empty."""
        cells = self.cells[job if self.by_job else ""] = self._empty()
        return cells

    def _empty(self) -> array[float]:
        return array("d", bytes(8 * (len(self.bounds) + 2)))

    def copy(self, key: str) -> array[float] | None:
        cells = self.cells.get(key)
        return None if cells is None else cells[:]


class Recorder:
    """Fills the run durations and lateness as each run (attempt) ends."""

    def __init__(self, by_job: bool) -> None:
        self.durations = Series(DURATION_BUCKETS if by_job else (), by_job=True)
        self.lateness = Series(LATENESS_BUCKETS, by_job=by_job)

    def run_finished(self, event: RunFinished) -> None:
        self.run_figures(
            event.job, event.tick, event.started, event.attempt, event.manual, event.duration_s
        )

    def run_figures(
        self, job: str, tick: float, started: float, attempt: int, manual: bool, duration: float
    ) -> None:
        """`run_finished`, from the run's figures: what the observers call when
        this recorder is the only one that hears runs end, with no event made
        (once per run with metrics on). An observation and lateness() inlined:
        their calls were a tenth of a tick."""
        series = self.durations  # by job
        cells = series.cells.get(job)
        if cells is None:
            cells = series.made(job)
        at = bisect_left(series.bounds, duration)
        cells[at] += 1
        cells[-1] += duration
        total = series.total
        total[at] += 1
        total[-1] += duration
        if attempt == 1 and not manual:
            late = started - tick
            if late < 0:
                late = 0.0
            series = self.lateness
            cells = series.cells.get(job if series.by_job else "")
            if cells is None:
                cells = series.made(job)
            at = bisect_left(series.bounds, late)
            cells[at] += 1
            cells[-1] += late
            if series.by_job:
                total = series.total
                total[at] += 1
                total[-1] += late


class Counting:
    """Multiprocess mode: this process's figures as prometheus_client's own
    metrics, counted as they happen (its files are summed across workers)."""

    def __init__(self, by_job: bool) -> None:
        job_name = ("job_name",)
        self.durations: Histogram | Summary
        if by_job:
            self.durations = Histogram(
                *DURATIONS, job_name, buckets=DURATION_BUCKETS, registry=None
            )
        else:
            self.durations = Summary(*DURATIONS, job_name, registry=None)
        self.lateness = Histogram(
            *LATENESS, job_name if by_job else (), buckets=LATENESS_BUCKETS, registry=None
        )
        self.by_job = by_job
        self.runs = Counter(
            PREFIX + "runs",
            "Runs (each attempt) that ended, by outcome.",
            ("job_name", "outcome"),
            registry=None,
        )
        self.skipped = Counter(
            PREFIX + "skipped_ticks",
            "Ticks that did not run, by reason.",
            ("job_name", "reason"),
            registry=None,
        )
        self.retries = Counter(PREFIX + "retries", "Retries started.", ("job_name",), registry=None)
        self.running = Gauge(
            PREFIX + "running",
            "Runs of the job going now.",
            ("job_name",),
            registry=None,
            multiprocess_mode="livesum",
        )

    def run_started(self, event: RunStarted) -> None:
        self.running.labels(event.job).inc()
        if event.attempt > 1:
            self.retries.labels(event.job).inc()

    def run_finished(self, event: RunFinished) -> None:
        job = event.job
        self.durations.labels(job).observe(event.duration_s)
        late = lateness(event)
        if late is not None:
            (self.lateness.labels(job) if self.by_job else self.lateness).observe(late)
        self.running.labels(job).dec()
        self.runs.labels(job, event.outcome).inc()

    def tick_skipped(self, event: TickSkipped) -> None:
        self.skipped.labels(event.job, event.reason).inc(event.ticks)
