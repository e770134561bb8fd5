"""Prometheus metrics of a scheduler: ``instrument(scheduler)``.

Needs prometheus_client (the extra ``[prometheus]``: ``pip install '.[prometheus]'``
in this project's clone); the app
serves the registry where it serves ``/metrics`` already, e.g.
``app.mount("/metrics", prometheus_client.make_asgi_app())``.

Two kinds of figures (every metric is named ``fastapi_jobs_*``; the job is the
``job_name`` label, as ``job`` is Prometheus's own target label):

* **This process's**: runs by outcome, skipped ticks by reason, retries and
  running, read from the scheduler's own counters when scraped (a tick pays
  nothing for them), and the run duration and lateness histograms, filled by
  an observer as each run ends. Under ``uvicorn --workers N`` each worker
  reports its own; sum them in queries.
* **The cluster's**, with a store: each claimed job's last success, last run
  and its outcome, running and paused, the live instances, and
  ``fastapi_jobs_store_up``. A scrape is synchronous and runs on the event
  loop, so it cannot wait for the database: a task of the scheduler reads the
  store (one ``Store.read()``) every ``max_age`` seconds while Prometheus
  scrapes, at the store's heartbeat pace when it does not, and at once when
  a scrape finds the figures older than ``max_age``; the scrape serves the
  latest reading. Every worker reports the same figures; a store that is down
  keeps the last reading, with ``store_up 0``.

With prometheus_client's multiprocess mode on (``PROMETHEUS_MULTIPROC_DIR``),
this process's figures are counted as they happen into prometheus_client's
own counters (its files, which it sums across workers) instead of read at
scrape time; pass the registry that the multiprocess collector serves.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate

import anyio
import anyio.from_thread
import anyio.lowlevel

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, values
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "fastapi_jobs.metrics needs prometheus_client: install fastapi_jobs with its extra "
        "[prometheus] (pip install '.[prometheus]' in its clone), or prometheus_client yourself"
    ) from exc

from ._errors import ConfigurationError, short
from ._observe import RunFinished, RunStarted, TickSkipped
from ._runner import JobRunner
from ._scheduler import Scheduler
from ._schedules import Every
from ._status import ClusterView

__all__ = ["DURATION_BUCKETS", "LATENESS_BUCKETS", "Metrics", "instrument"]

PREFIX = "fastapi_jobs_"
OUTCOMES = ("ok", "failed", "timed_out", "cancelled")
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""Seconds: jobs run from milliseconds (a cleanup) to an hour (a report)."""
LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30)
"""Seconds from a tick to its run's start: milliseconds when healthy."""
# The cluster's figures are read every max_age seconds while a scrape came
# within this long; after it, every store.heartbeat seconds.
LINGER = 300.0

_log = logging.getLogger("fastapi_jobs.metrics")


def instrument(
    scheduler: Scheduler, registry: CollectorRegistry | None = None, *, max_age: float = 2.0
) -> Metrics:
    """Register the scheduler's metrics in ``registry`` (prometheus_client's
    default one if None). Call once per scheduler and registry, before the app
    starts. ``max_age``: how old (seconds) the cluster's figures may be when
    scraped; with a store, it is read that often while Prometheus scrapes."""
    if not isinstance(scheduler, Scheduler):
        raise ConfigurationError(f"instrument({short(scheduler)}): give it the Scheduler")
    if (
        not isinstance(max_age, int | float)
        or isinstance(max_age, bool)
        or not 0.1 <= max_age <= 3600
    ):
        raise ConfigurationError(f"instrument(max_age={short(max_age)}): seconds, from 0.1 to 3600")
    if scheduler._state is not None:
        raise ConfigurationError(
            "instrument() a scheduler before it starts (at import, beside the app): "
            "the store's readings are a task of its lifespan"
        )
    return Metrics(scheduler, REGISTRY if registry is None else registry, float(max_age))


class Metrics:
    """The collector ``instrument()`` registers (and the task that reads the
    store for it). ``refresh()`` reads the cluster's figures now."""

    def __init__(self, scheduler: Scheduler, registry: CollectorRegistry, max_age: float) -> None:
        self.scheduler = scheduler
        self.max_age = max_age
        self.multiprocess = values.ValueClass is not values.MutexValue
        self._view: ClusterView | None = None
        self._store_up: bool | None = None  # None: not read yet
        self._read_at = -math.inf  # time.monotonic() of the last reading (or try)
        self._scraped_at = -math.inf
        self._wanted: anyio.Event | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._thread = 0
        self._intervals: dict[str, tuple[float, float]] = {}  # cron jobs: (tick, gap to next)
        # In multiprocess mode prometheus_client's metrics live in its files, which
        # its collector reads (so they are registered nowhere); else, our arrays.
        self._recorder = None if self.multiprocess else _Recorder()
        try:
            registry.register(self)
        except ValueError as exc:
            raise ConfigurationError(
                f"instrument(): {exc} (is this scheduler instrumented twice?)"
            ) from exc
        scheduler.add_observer(_Counting() if self._recorder is None else self._recorder)
        store = scheduler.store
        self._idle = max(max_age, 10.0 if store is None else store.heartbeat)
        if store is not None:
            scheduler._services.append(self._read_while_scraped)

    # -- the cluster's figures ----------------------------------------------

    async def refresh(self) -> None:
        """Read the cluster's figures from the store now (what the scheduler's
        task does every ``max_age`` seconds while scraped)."""
        store = self.scheduler.store
        if store is None:
            return
        self._read_at = time.monotonic()
        try:
            with anyio.fail_after(store.timeout):
                view = await store.read()
        except Exception as exc:  # noqa: BLE001 - store_up 0 says it; the scrape goes on
            if self._store_up is not False:
                _log.warning("metrics: cannot read the store (store_up 0): %r", exc)
            self._store_up = False
            return
        if self._store_up is False:
            _log.info("metrics: the store answers again (store_up 1)")
        self._view, self._store_up = view, True

    async def _read_while_scraped(self) -> None:
        self._token, self._thread = anyio.lowlevel.current_token(), threading.get_ident()
        try:
            await self.refresh()
            while True:
                self._wanted = wanted = anyio.Event()
                scraped = time.monotonic() - self._scraped_at < LINGER
                # Not scraped lately: read at the heartbeat's pace, so that a
                # first scrape (or one every few minutes) is not served old figures.
                with anyio.move_on_after(self.max_age if scraped else self._idle):
                    await wanted.wait()
                await self.refresh()
        finally:
            self._wanted = self._token = None

    def _scraped(self) -> None:
        """A scrape: if the figures are older than ``max_age``, ask for a reading."""
        self._scraped_at = now = time.monotonic()
        wanted = self._wanted
        if wanted is None or now - self._read_at < self.max_age:
            return
        if threading.get_ident() == self._thread:
            wanted.set()
        elif self._token is not None:  # scraped from a thread (start_http_server, a WSGI app)
            with contextlib.suppress(RuntimeError):  # the scheduler's loop has stopped
                anyio.from_thread.run_sync(wanted.set, token=self._token)

    # -- prometheus_client's collector protocol -----------------------------

    def describe(self) -> Iterator[Metric]:
        return self._families(describe=True)

    def collect(self) -> Iterator[Metric]:
        self._scraped()
        return self._families(describe=False)

    def _families(self, *, describe: bool) -> Iterator[Metric]:
        scheduler = self.scheduler
        runners = [] if describe else list(scheduler._runners.values())
        now = scheduler._ticking_clock.now()
        view = self._view
        with_store = scheduler.store is not None

        if self._recorder is not None:
            yield from self._process_counters(runners)
            yield self._recorder.durations.family()
            yield self._recorder.lateness.family()
        running = _gauge("scheduler_running", "1 if this process's scheduler is running.")
        running.add_metric([], float(scheduler._state is not None))
        yield running
        next_run = _gauge("next_run_timestamp_seconds", "The job's next tick.", "job_name")
        interval = _gauge(
            "interval_seconds",
            "The time between the job's ticks (for a cron job: from its next tick to the "
            "one after). Alert on time() - last_success > 2 x this.",
            "job_name",
        )
        success = _gauge(
            "last_success_timestamp_seconds",
            "When the job's latest successful run ended: across instances for a job "
            "claimed in a store, else in this process; 0 if it ran but no success is on "
            "record.",
            "job_name",
        )
        paused = _gauge("paused", "1 if the job's ticks are skipped as paused.", "job_name")
        for runner in runners:
            name, stats = runner.job.name, runner.stats
            if stats.next_run_at is not None:
                next_run.add_metric([name], stats.next_run_at)
                gap = self._interval(runner, stats.next_run_at)
                if gap is not None:
                    interval.add_metric([name], gap)
            if runner.store is not None:
                cluster = None if view is None else view.jobs.get(name)
                if cluster is not None:
                    last = cluster.last_success_at
                    success.add_metric([name], 0.0 if last is None else last.timestamp())
            elif stats.last_ok_at is not None:
                success.add_metric([name], stats.last_ok_at)
            elif stats.runs:
                success.add_metric([name], 0.0)
            # Kept in step with the store's pauses by each heartbeat.
            paused.add_metric([name], float(runner.paused_until > now))
        yield from (next_run, interval, success, paused)
        if with_store or describe:
            yield from self._cluster(view)

    def _process_counters(self, runners: list[JobRunner]) -> Iterator[Metric]:
        runs = _counter(
            "runs",
            "Runs (each attempt) that ended in this process, by outcome.",
            "job_name",
            "outcome",
        )
        skipped = _counter(
            "skipped_ticks",
            "Ticks that did not run in this process, by reason.",
            "job_name",
            "reason",
        )
        retries = _counter("retries", "Retries started in this process.", "job_name")
        running = _gauge("running", "1 while a run of the job goes in this process.", "job_name")
        for runner in runners:
            name, stats = runner.job.name, runner.stats
            by_outcome = (
                stats.ok,
                stats.failures - stats.timeouts,
                stats.timeouts,
                stats.cancelled,
            )
            for outcome, count in zip(OUTCOMES, by_outcome, strict=True):
                runs.add_metric([name, outcome], count)
            for reason, count in (stats.skipped or {}).items():
                skipped.add_metric([name, reason], count)
            retries.add_metric([name], stats.retries)
            running.add_metric([name], float(runner.busy))
        yield from (runs, skipped, retries, running)

    def _cluster(self, view: ClusterView | None) -> Iterator[Metric]:
        up = _gauge(
            "store_up", "1 if the store answered the last reading (figures below are from it)."
        )
        up.add_metric([], float(bool(self._store_up)))
        yield up
        read = _gauge(
            "cluster_read_timestamp_seconds", "When the store was last read (the database's clock)."
        )
        last_run = _gauge(
            "last_run_timestamp_seconds",
            "When the job's last claimed run ended, on any instance.",
            "job_name",
        )
        outcome = _gauge(
            "last_outcome",
            "1 for the outcome of the job's last claimed run, on any instance.",
            "job_name",
            "outcome",
        )
        running = _gauge(
            "cluster_running", "1 while an instance holds a live lease on the job.", "job_name"
        )
        instances = _gauge("instances", "Instances whose heartbeat the store has seen lately.")
        if view is not None:
            if view.read_at is not None:
                read.add_metric([], view.read_at)
            instances.add_metric([], len(view.instances))
            for name, job in view.jobs.items():
                if job.last_finished_at is not None:
                    last_run.add_metric([name], job.last_finished_at.timestamp())
                if job.last_outcome is not None:
                    for each in OUTCOMES:
                        outcome.add_metric([name, each], float(each == job.last_outcome))
                running.add_metric([name], float(job.running_on is not None))
        yield from (read, last_run, outcome, running, instances)

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


def _gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=labels)


def _counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, labels=labels)


def _lateness(event: RunFinished) -> float | None:
    """From the tick to the run's start, for a scheduled first attempt (a retry
    or a run by hand starts when it starts, not late)."""
    if event.attempt != 1 or event.manual:
        return None
    late = event.started - event.tick
    return late if late > 0 else 0.0


class _Histogram:
    """One histogram by job, kept as plain arrays: an observation is a bisect and
    two additions. (prometheus_client's ``Histogram`` takes a lock for the bucket
    and one for the sum: +7 µs a run for the two histograms here.)"""

    __slots__ = ("bounds", "doc", "jobs", "name")

    def __init__(self, name: str, doc: str, bounds: tuple[float, ...]) -> None:
        self.name, self.doc, self.bounds = name, doc, bounds
        # Per job: a count per bucket (the last one +Inf), then the sum.
        self.jobs: dict[str, array[float]] = {}

    def observe(self, job: str, value: float) -> None:
        cells = self.jobs.get(job)
        if cells is None:
            cells = self.jobs[job] = array("d", bytes(8 * (len(self.bounds) + 2)))
        cells[bisect_left(self.bounds, value)] += 1  # le: a value equal to a bound is in it
        cells[-1] += value

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.doc, labels=("job_name",))
        edges = [*(repr(float(bound)) for bound in self.bounds), "+Inf"]
        for job, cells in list(self.jobs.items()):
            counts = list(accumulate(cells[:-1]))
            family.add_metric([job], list(zip(edges, counts, strict=True)), cells[-1])
        return family


class _Recorder:
    """Fills the run histograms as each run (attempt) ends."""

    def __init__(self) -> None:
        self.durations = _Histogram(
            PREFIX + "run_duration_seconds", "How long each run (attempt) took.", DURATION_BUCKETS
        )
        self.lateness = _Histogram(
            PREFIX + "run_lateness_seconds",
            "From a tick to the start of its run (scheduled first attempts).",
            LATENESS_BUCKETS,
        )

    def run_finished(self, event: RunFinished) -> None:
        self.durations.observe(event.job, event.duration_s)
        late = _lateness(event)
        if late is not None:
            self.lateness.observe(event.job, late)


class _Counting:
    """Multiprocess mode: this process's figures as prometheus_client's own
    metrics, counted as they happen (its files are summed across workers)."""

    def __init__(self) -> None:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, ("job_name",), buckets=buckets, registry=None)

        self.durations = histogram(
            "run_duration_seconds", "How long each run (attempt) took.", DURATION_BUCKETS
        )
        self.lateness = histogram(
            "run_lateness_seconds",
            "From a tick to the start of its run (scheduled first attempts).",
            LATENESS_BUCKETS,
        )
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
        late = _lateness(event)
        if late is not None:
            self.lateness.labels(job).observe(late)
        self.running.labels(job).dec()
        self.runs.labels(job, event.outcome).inc()

    def tick_skipped(self, event: TickSkipped) -> None:
        self.skipped.labels(event.job, event.reason).inc(event.ticks)
