"""What a scrape shows of a scheduler: each job's numbers, copied on the event
loop in one go (a ``Row``: the scheduler changes them on the loop, and a
family's samples must agree with each other), then emitted into a sink
(``metrics._sinks``) in prometheus_client's order of families."""

from __future__ import annotations

from array import array
from itertools import accumulate
from typing import NamedTuple

from .._core.runner import JobRunner
from .._core.seam import Seam
from .._schedules import Every
from .._status import ClusterJobStatus, ClusterView
from ._ledger import OUTCOMES, Counts, Ledger
from ._recorders import DURATIONS, LATENESS, Recorder, Series
from ._sinks import (
    CLUSTER_RUNNING,
    HAND_OFF,
    INSTANCES,
    INTERVAL,
    JOBS,
    LAST_RUN,
    NEXT_RUN,
    OUTCOME,
    PAUSED,
    PER_JOB,
    READ,
    RETRIES,
    RUNNING,
    RUNS,
    SCHEDULER_RUNNING,
    SKIPPED,
    STORE_UP,
    SUCCESS,
    SUMMED,
    Family,
    MetricSink,
    TextSink,
)

__all__ = ["JobRows", "Row", "Snapshot", "Totals"]

Sink = MetricSink | TextSink


class Row(NamedTuple):
    """One job's numbers, copied on the event loop in one go."""

    name: str
    runs: int
    ok: int
    failures: int
    timeouts: int
    cancelled: int
    skipped: dict[str, int] | None
    retries: int
    earlier: Counts | None  # what the jobs of its name that left counted
    busy: bool
    next_run_at: float | None
    interval: float | None
    claimed: bool
    last_ok_at: float | None
    paused: bool
    durations: array[float] | None
    lateness: array[float] | None  # by job only
    hand_off: str | None


class Snapshot(NamedTuple):
    """What is one per process, copied on the event loop."""

    scheduler_running: bool
    lateness: array[float] | None  # of the process (not by job)
    view: ClusterView | None
    store_up: bool | None
    jobs: int
    summed: bool  # past per_job_limit: the counts summed over the jobs


class Totals(Counts):
    """This process's counts summed over its jobs (past per_job_limit), those
    that left included."""

    __slots__ = ("durations", "lateness", "running")

    def __init__(self) -> None:
        super().__init__()
        self.running = 0
        self.durations: array[float] | None = None
        self.lateness: array[float] | None = None  # histograms by job only


class JobRows:
    """The families of one scheduler's metrics, and how its state fills them."""

    def __init__(self, seam: Seam, recorder: Recorder | None, histograms_by_job: bool) -> None:
        self.seam, self._recorder = seam, recorder
        self.histograms_by_job = histograms_by_job
        # What the jobs that left counted (in multiprocess mode, no recorder:
        # prometheus_client's own counters keep every job's, gone or not).
        self.ledger = None if recorder is None else Ledger(recorder, seam.names().__contains__)
        self._intervals: dict[str, tuple[float, float]] = {}  # cron jobs: (tick, gap to next)
        seam.on_leaving(self._left)
        self.durations = Family(
            DURATIONS[0],
            "histogram" if histograms_by_job else "summary",
            DURATIONS[1],
            ("job_name",),
        )
        self.lateness = Family(
            LATENESS[0], "histogram", LATENESS[1], ("job_name",) if histograms_by_job else ()
        )
        # In the order prometheus_client's families were yielded (and are written).
        # In multiprocess mode (no recorder) the counts are prometheus_client's own.
        counted = [RUNS, SKIPPED, RETRIES, RUNNING, self.durations, self.lateness]
        cluster = [STORE_UP, READ, LAST_RUN, OUTCOME, CLUSTER_RUNNING, INSTANCES]
        self.families = [
            *(counted if recorder is not None else ()),
            *(SCHEDULER_RUNNING, JOBS, PER_JOB, NEXT_RUN, INTERVAL, SUCCESS, PAUSED, HAND_OFF),
            *(cluster if seam.store is not None else ()),
        ]
        # Past per_job_limit: the same names, summed over the jobs (no job_name),
        # and no per-job gauges (a next tick, a last success are one job's).
        self.summed_durations = Family(self.durations.name, self.durations.kind, DURATIONS[1])
        self.summed_lateness = (
            Family(LATENESS[0], "histogram", LATENESS[1]) if histograms_by_job else self.lateness
        )
        summed = [
            *(SUMMED[family] for family in (RUNS, SKIPPED, RETRIES, RUNNING)),
            self.summed_durations,
            self.summed_lateness,
        ]
        self.summed_families = [
            *(summed if recorder is not None else ()),
            SCHEDULER_RUNNING,
            JOBS,
            PER_JOB,
            *((STORE_UP, READ, INSTANCES) if seam.store is not None else ()),
        ]

    def _left(self, runner: JobRunner) -> None:
        """A job left the scheduler: its counts are kept, its schedule's gap is not."""
        self._intervals.pop(runner.job.name, None)
        if self.ledger is not None:
            self.ledger.gone(runner)

    def snapshot(
        self, view: ClusterView | None, store_up: bool | None, jobs: int, summed: bool
    ) -> Snapshot:
        recorder = self._recorder
        if self.ledger is not None:
            self.ledger.sweep()  # the runs that went on after their job left, ended since
        lateness = None
        if recorder is not None and not recorder.lateness.by_job:
            lateness = recorder.lateness.copy("")
        running = self.seam.running
        return Snapshot(running, lateness, view, store_up, jobs, summed)

    def rows(self, runners: list[JobRunner]) -> list[Row]:
        now = self.seam.now()
        recorder = self._recorder
        durations = None if recorder is None else recorder.durations
        lateness = None if recorder is None or not recorder.lateness.by_job else recorder.lateness
        ledger = self.ledger
        # A job made again under the name of one that left counts on from it.
        earlier_of = ledger.earlier if ledger and (ledger.carried or ledger.remembered) else None
        rows = []
        for runner in runners:
            name, stats = runner.job.name, runner.stats
            tick = stats.next_run_at
            skipped = stats.skipped
            rows.append(
                Row(
                    name,
                    stats.runs,
                    stats.ok,
                    stats.failures,
                    stats.timeouts,
                    stats.cancelled,
                    None if skipped is None else dict(skipped),
                    stats.retries,
                    None if earlier_of is None else earlier_of(name),
                    runner.busy,
                    tick,
                    None if tick is None else self._interval(runner, tick),
                    runner.store is not None,
                    stats.last_ok_at,
                    # Kept in step with the store's pauses by each heartbeat.
                    runner.paused_until > now,
                    None if durations is None else durations.copy(name),
                    None if lateness is None else lateness.copy(name),
                    None if runner.job.enqueue is None else runner.job.enqueue.name,
                )
            )
        return rows

    def emit_process(self, snapshot: Snapshot, sink: Sink) -> None:
        if self._recorder is not None and not self.histograms_by_job:
            self._series(sink, self.lateness, (), snapshot.lateness, self._recorder.lateness)
        sink.add(SCHEDULER_RUNNING, "", (), float(snapshot.scheduler_running))
        sink.add(JOBS, "", (), snapshot.jobs)
        sink.add(PER_JOB, "", (), float(not snapshot.summed))
        if self.seam.store is None:
            return
        sink.add(STORE_UP, "", (), float(bool(snapshot.store_up)))
        view = snapshot.view
        if view is not None:
            if view.read_at is not None:
                sink.add(READ, "", (), view.read_at)
            sink.add(INSTANCES, "", (), len(view.instances))

    def emit_jobs(self, rows: list[Row], view: ClusterView | None, sink: Sink) -> None:
        recorder = self._recorder
        if recorder is not None:
            self._process_counters(rows, sink)
            for row in rows:
                job = (row.name,)
                self._series(sink, self.durations, job, row.durations, recorder.durations)
                if self.histograms_by_job:
                    self._series(sink, self.lateness, job, row.lateness, recorder.lateness)
        for row in rows:
            job = (row.name,)
            if row.next_run_at is not None:
                sink.add(NEXT_RUN, "", job, row.next_run_at)
                if row.interval is not None:
                    sink.add(INTERVAL, "", job, row.interval)
            if row.claimed:
                cluster = None if view is None else view.jobs.get(row.name)
                if cluster is not None:
                    last = cluster.last_success_at
                    sink.add(SUCCESS, "", job, 0.0 if last is None else last.timestamp())
            elif row.last_ok_at is not None:
                sink.add(SUCCESS, "", job, row.last_ok_at)
            elif row.runs:
                sink.add(SUCCESS, "", job, 0.0)
            sink.add(PAUSED, "", job, float(row.paused))
            if row.hand_off is not None:
                sink.add(HAND_OFF, "", (row.name, row.hand_off), 1.0)

    def add_up(self, runners: list[JobRunner], totals: Totals) -> None:
        """Add the counts of ``runners`` to ``totals`` (on the event loop)."""
        if self._recorder is None:
            return  # multiprocess mode: the counts are prometheus_client's own
        outcomes, skipped = totals.outcomes, totals.skipped
        for runner in runners:  # Counts.add_stats, inlined: 100,000 jobs a scrape
            stats = runner.stats
            outcomes[0] += stats.ok
            outcomes[1] += stats.failures - stats.timeouts
            outcomes[2] += stats.timeouts
            outcomes[3] += stats.cancelled
            if stats.skipped:
                for reason, count in stats.skipped.items():
                    skipped[reason] = skipped.get(reason, 0) + count
            totals.retries += stats.retries
            totals.running += runner.busy

    def closed(self, totals: Totals) -> Totals:
        """``totals`` of the jobs here, with what the jobs that left counted, and
        every run timed here (on the event loop)."""
        recorder, ledger = self._recorder, self.ledger
        if recorder is None or ledger is None:
            return totals
        totals.add(ledger.parked)
        total = recorder.durations.total
        totals.durations = total[:] if any(total) else None
        total = recorder.lateness.total
        totals.lateness = total[:] if recorder.lateness.by_job and any(total) else None
        return totals

    def emit_totals(self, totals: Totals, sink: Sink) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        for outcome, count in zip(OUTCOMES, totals.outcomes, strict=True):
            sink.add(SUMMED[RUNS], "_total", (outcome,), count)
        for reason, count in totals.skipped.items():
            sink.add(SUMMED[SKIPPED], "_total", (reason,), count)
        sink.add(SUMMED[RETRIES], "_total", (), totals.retries)
        sink.add(SUMMED[RUNNING], "", (), totals.running)
        self._series(sink, self.summed_durations, (), totals.durations, recorder.durations)
        if self.histograms_by_job:
            self._series(sink, self.summed_lateness, (), totals.lateness, recorder.lateness)

    def _process_counters(self, rows: list[Row], sink: Sink) -> None:
        for row in rows:  # each job's JobStats, as copied on the loop
            name = row.name
            by_outcome: tuple[int, ...] = (  # each run ended counted once, by its outcome
                row.ok,
                row.failures - row.timeouts,
                row.timeouts,
                row.cancelled,
            )
            skipped, retries = row.skipped, row.retries
            if row.earlier is not None:  # a job made again under its name counts on
                by_outcome, skipped, retries = _on_from(row.earlier, by_outcome, skipped, retries)
            for outcome, count in zip(OUTCOMES, by_outcome, strict=True):
                sink.add(RUNS, "_total", (name, outcome), count)
            for reason, count in (skipped or {}).items():
                sink.add(SKIPPED, "_total", (name, reason), count)
            sink.add(RETRIES, "_total", (name,), retries)
            sink.add(RUNNING, "", (name,), float(row.busy))

    @staticmethod
    def _series(
        sink: Sink,
        family: Family,
        labels: tuple[str, ...],
        cells: array[float] | None,
        series: Series,
    ) -> None:
        if cells is None:
            return
        if series.bounds:
            for edge, count in zip(series.edges, accumulate(cells[:-1]), strict=True):
                sink.add(family, "_bucket", (*labels, edge), count)
            sink.add(family, "_count", labels, count)
        else:
            sink.add(family, "_count", labels, cells[0])
        sink.add(family, "_sum", labels, cells[-1])

    @staticmethod
    def emit_cluster_jobs(jobs: list[tuple[str, ClusterJobStatus]], sink: Sink) -> None:
        for name, job in jobs:
            label = (name,)
            if job.last_finished_at is not None:
                sink.add(LAST_RUN, "", label, job.last_finished_at.timestamp())
            if job.last_outcome is not None:
                for each in OUTCOMES:
                    sink.add(OUTCOME, "", (name, each), float(each == job.last_outcome))
            sink.add(CLUSTER_RUNNING, "", label, float(job.running_on is not None))

    def _interval(self, runner: JobRunner, tick: float) -> float | None:
        schedule = runner.job.schedule
        if isinstance(schedule, Every):
            return schedule.interval.total_seconds()
        known = self._intervals.get(runner.job.name)
        if known is None or known[0] != tick:
            # A cron's next tick, asked once per tick (not per scrape).
            try:
                after = schedule.next_after(tick)
            except Exception:  # noqa: BLE001 - a custom schedule's bug must not fail a scrape
                return None
            known = self._intervals[runner.job.name] = (tick, after - tick)
        return known[1]


def _on_from(
    earlier: Counts, by_outcome: tuple[int, ...], skipped: dict[str, int] | None, retries: int
) -> tuple[tuple[int, ...], dict[str, int], int]:
    """A job's counts, on from what the earlier jobs of its name counted."""
    added = dict(skipped or {})
    for reason, count in earlier.skipped.items():
        added[reason] = added.get(reason, 0) + count
    summed = tuple(now + then for now, then in zip(by_outcome, earlier.outcomes, strict=True))
    return summed, added, retries + earlier.retries
