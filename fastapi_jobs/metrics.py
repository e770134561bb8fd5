"""Prometheus metrics of a scheduler: ``instrument(scheduler)``.

Needs prometheus_client (``pip install 'fastapi-jobs[prometheus]'``). Serve them
with ``app.include_router(metrics.router())``: ``GET /metrics`` writes the
scheduler's figures in slices, with the event loop's other work in between,
and serves a rendering again for ``max_age`` (prometheus_client's
``make_asgi_app`` renders the whole registry in one go on the loop: 2.4 s at
5,000 jobs, during which no request was answered).

Two kinds of figures (every metric is named ``fastapi_jobs_*``; the job is the
``job_name`` label, as ``job`` is Prometheus's own target label):

* **This process's**: runs by outcome, skipped ticks by reason, retries and
  running, read from the scheduler's own counters when scraped (a tick pays
  nothing for them), and the run durations (a summary per job) and lateness (a
  histogram of the process; both histograms per job with
  ``histograms_by_job=True``), filled by an observer as each run ends. Under
  ``uvicorn --workers N`` each worker reports its own; sum them in queries.
* **The cluster's**, with a store: each claimed job's last success, last run
  and its outcome, running and paused, the live instances, and
  ``fastapi_jobs_store_up``. A scrape cannot wait for the database: a task of
  the scheduler reads the store (one ``Store.read()``) every ``max_age`` seconds
  while Prometheus scrapes, at the store's heartbeat pace when it does not, and
  at once when a scrape finds the figures older than ``max_age``; the scrape
  serves the latest reading. Every worker reports the same figures; a store that
  is down keeps the last reading, with ``store_up 0``.

The scheduler's state changes on the event loop, so its numbers are read
there: each job's together (a row, copied in one go). A scrape from another
thread (``start_http_server``, a sync endpoint) has the rows copied on the loop
and builds the families from the copy in its own thread.

With prometheus_client's multiprocess mode on (``PROMETHEUS_MULTIPROC_DIR``),
this process's figures are counted as they happen into prometheus_client's
own metrics (its files, which it sums across workers) instead of read at
scrape time; pass the registry that the multiprocess collector serves. Each
worker, as it starts and before each scrape ``router()`` serves, marks dead the
files of workers that have ended (``mark_process_dead``), so a SIGKILLed
worker's ``running`` goes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

try:
    from prometheus_client import REGISTRY, CollectorRegistry, values
    from prometheus_client.core import Metric
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "fastapi_jobs.metrics needs prometheus_client: pip install 'fastapi-jobs[prometheus]'"
    ) from exc

from ._errors import ConfigurationError, short
from ._families import Family, MetricSink, TextSink, header
from ._recorders import (
    DURATION_BUCKETS,
    DURATIONS,
    LATENESS,
    LATENESS_BUCKETS,
    PREFIX,
    Counting,
    Recorder,
    Series,
)
from ._runner import JobRunner
from ._scheduler import Scheduler
from ._schedules import Every
from ._scrape import Exposition, forget_dead_processes
from ._status import ClusterJobStatus, ClusterView

if TYPE_CHECKING:
    from fastapi import APIRouter

__all__ = ["DURATION_BUCKETS", "LATENESS_BUCKETS", "Metrics", "instrument"]

OUTCOMES = ("ok", "failed", "timed_out", "cancelled")
# The cluster's figures are read every max_age seconds while a scrape came
# within this long; after it, every store.heartbeat seconds.
LINGER = 300.0
# A scrape written by router() lets the event loop run after this long (s) of
# writing, and looks at the time every this many jobs.
TURN = 0.001
STRIDE = 10

_log = logging.getLogger("fastapi_jobs.metrics")


def _family(name: str, kind: str, doc: str, *labels: str) -> Family:
    return Family(PREFIX + name, kind, doc, labels)


RUNS = _family(
    "runs",
    "counter",
    "Runs (each attempt) that ended in this process, by outcome.",
    "job_name",
    "outcome",
)
SKIPPED = _family(
    "skipped_ticks",
    "counter",
    "Ticks that did not run in this process, by reason.",
    "job_name",
    "reason",
)
RETRIES = _family("retries", "counter", "Retries started in this process.", "job_name")
RUNNING = _family("running", "gauge", "1 while a run of the job goes in this process.", "job_name")
SCHEDULER_RUNNING = _family(
    "scheduler_running", "gauge", "1 if this process's scheduler is running."
)
NEXT_RUN = _family("next_run_timestamp_seconds", "gauge", "The job's next tick.", "job_name")
INTERVAL = _family(
    "interval_seconds",
    "gauge",
    "The time between the job's ticks (for a cron job: from its next tick to the "
    "one after). Alert on time() - last_success > 2 x this.",
    "job_name",
)
SUCCESS = _family(
    "last_success_timestamp_seconds",
    "gauge",
    "When the job's latest successful run ended: across instances for a job "
    "claimed in a store, else in this process; 0 if it ran but no success is on "
    "record.",
    "job_name",
)
PAUSED = _family("paused", "gauge", "1 if the job's ticks are skipped as paused.", "job_name")
STORE_UP = _family(
    "store_up",
    "gauge",
    "1 if the store answered the last reading (figures below are from it).",
)
READ = _family(
    "cluster_read_timestamp_seconds",
    "gauge",
    "When the store was last read (the database's clock).",
)
LAST_RUN = _family(
    "last_run_timestamp_seconds",
    "gauge",
    "When the job's last claimed run ended, on any instance.",
    "job_name",
)
OUTCOME = _family(
    "last_outcome",
    "gauge",
    "1 for the outcome of the job's last claimed run, on any instance.",
    "job_name",
    "outcome",
)
CLUSTER_RUNNING = _family(
    "cluster_running", "gauge", "1 while an instance holds a live lease on the job.", "job_name"
)
INSTANCES = _family("instances", "gauge", "Instances whose heartbeat the store has seen lately.")


def instrument(
    scheduler: Scheduler,
    registry: CollectorRegistry | None = None,
    *,
    max_age: float = 2.0,
    histograms_by_job: bool = False,
) -> Metrics:
    """Register the scheduler's metrics in ``registry`` (prometheus_client's
    default one if None). Call once per scheduler and registry, before the app
    starts, and serve them with ``app.include_router(metrics.router())``.

    ``max_age``: how old (seconds) the figures may be when scraped: a rendering
    is served again for that long, and with a store, the store is read that
    often while Prometheus scrapes. ``histograms_by_job``: the run durations and
    lateness as histograms per job (``DURATION_BUCKETS``, ``LATENESS_BUCKETS``:
    44 series a job instead of 12); by default a summary of each job's run
    durations (their sum and count) and one lateness histogram for the process.
    """
    if not isinstance(scheduler, Scheduler):
        raise ConfigurationError(f"instrument({short(scheduler)}): give it the Scheduler")
    if (
        not isinstance(max_age, int | float)
        or isinstance(max_age, bool)
        or not 0.1 <= max_age <= 3600
    ):
        raise ConfigurationError(f"instrument(max_age={short(max_age)}): seconds, from 0.1 to 3600")
    if not isinstance(histograms_by_job, bool):
        raise ConfigurationError(
            f"instrument(histograms_by_job={short(histograms_by_job)}): True or False"
        )
    if scheduler._state is not None:
        raise ConfigurationError(
            "instrument() a scheduler before it starts (at import, beside the app): "
            "the store's readings are a task of its lifespan"
        )
    return Metrics(
        scheduler, REGISTRY if registry is None else registry, float(max_age), histograms_by_job
    )


class _Row(NamedTuple):
    """One job's numbers, copied on the event loop in one go."""

    name: str
    runs: int
    running: bool
    failures: int
    timeouts: int
    cancelled: int
    skipped: dict[str, int] | None
    retries: int
    busy: bool
    next_run_at: float | None
    interval: float | None
    claimed: bool
    last_ok_at: float | None
    paused: bool
    durations: array[float] | None
    lateness: array[float] | None  # by job only


class _Snapshot(NamedTuple):
    scheduler_running: bool
    lateness: array[float] | None  # of the process (not by job)
    view: ClusterView | None
    store_up: bool | None


class Metrics:
    """The collector ``instrument()`` registers (and the task that reads the
    store for it). ``router()`` serves it; ``refresh()`` reads the cluster's
    figures now."""

    def __init__(
        self,
        scheduler: Scheduler,
        registry: CollectorRegistry,
        max_age: float,
        histograms_by_job: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.registry = registry
        self.max_age = max_age
        self.histograms_by_job = histograms_by_job
        self.multiprocess = values.ValueClass is not values.MutexValue
        self._view: ClusterView | None = None
        self._store_up: bool | None = None  # None: not read yet
        self._read_at = -math.inf  # time.monotonic() of the last reading (or try)
        self._scraped_at = -math.inf
        self._wanted: anyio.Event | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._thread = 0
        self._local = threading.local()  # .quiet: router() writes these figures itself
        self._exposition: Exposition | None = None
        self._headers: dict[str, dict[Family, str]] = {}  # by content type
        self._intervals: dict[str, tuple[float, float]] = {}  # cron jobs: (tick, gap to next)
        # In multiprocess mode prometheus_client's metrics live in its files, which
        # its collector reads (so they are registered nowhere); else, our arrays.
        self._recorder = None if self.multiprocess else Recorder(histograms_by_job)
        self.durations = Family(
            DURATIONS[0],
            "histogram" if histograms_by_job else "summary",
            DURATIONS[1],
            ("job_name",),
        )
        self.lateness = Family(
            LATENESS[0], "histogram", LATENESS[1], ("job_name",) if histograms_by_job else ()
        )
        counted = [] if self._recorder is None else [RUNS, SKIPPED, RETRIES, RUNNING]
        if self._recorder is not None:
            counted += [self.durations, self.lateness]
        cluster = [] if scheduler.store is None else [STORE_UP, READ, LAST_RUN, OUTCOME]
        cluster += [CLUSTER_RUNNING, INSTANCES] if cluster else []
        self.families = [
            *counted,
            SCHEDULER_RUNNING,
            NEXT_RUN,
            INTERVAL,
            SUCCESS,
            PAUSED,
            *cluster,
        ]
        try:
            registry.register(self)
        except ValueError as exc:
            raise ConfigurationError(
                f"instrument(): {exc} (is this scheduler instrumented twice?)"
            ) from exc
        scheduler.add_observer(
            Counting(histograms_by_job) if self._recorder is None else self._recorder
        )
        store = scheduler.store
        self._idle = max(max_age, 10.0 if store is None else store.heartbeat)
        scheduler._services.append(self._serve)

    def router(self, path: str = "/metrics") -> APIRouter:
        """A router with ``GET path`` (``/metrics``): Prometheus's text format or
        OpenMetrics as the scraper asks, gzipped if it accepts it, a rendering
        served again for ``max_age``. Pass the app's own auth with
        ``app.include_router(metrics.router(), dependencies=[...])``.
        """
        from fastapi import APIRouter, Response

        if self._exposition is None:
            self._exposition = Exposition(self._render, self.max_age, self.multiprocess)
        router = APIRouter()
        router.add_api_route(
            path,
            self._exposition.__call__,
            methods=["GET"],
            include_in_schema=False,
            response_class=Response,
            name="fastapi_jobs_metrics",
        )
        return router

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

    async def _serve(self) -> None:
        """A task of the scheduler's lifespan: the loop where a scrape from another
        thread has its rows copied, and the store's readings."""
        self._token, self._thread = anyio.lowlevel.current_token(), threading.get_ident()
        try:
            if self.multiprocess:
                # A respawned worker cleans up after the one that was killed.
                await anyio.to_thread.run_sync(forget_dead_processes)
            if self.scheduler.store is None:
                await anyio.sleep_forever()
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
            self._thread = 0

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

    # -- what router() serves: written on the loop, a slice at a time --------

    async def _render(
        self, encoder: Callable[[CollectorRegistry], bytes], content_type: str
    ) -> list[bytes]:
        """The registry as ``encoder`` writes it (``content_type``), in pieces:
        the scheduler's figures by ``_text()``, the rest by prometheus_client."""
        headers = self._headers.get(content_type)
        if headers is None:
            headers = self._headers[content_type] = {}

        def written(family: Family) -> str:
            known = headers.get(family)
            if known is None:
                known = headers[family] = header(family, encoder)
            return known

        ours = await self._text(written)
        # The registry's other collectors (the process's, the app's own); in
        # OpenMetrics, their "# EOF" ends it all.
        with self._quiet():
            rest = encoder(self.registry)
        return [*ours, rest]

    async def _text(self, headers: Callable[[Family], str]) -> list[bytes]:
        """The scheduler's figures as exposition text, in pieces (each family
        under ``headers(family)``), written on the event loop, which runs its
        other work every ``TURN`` seconds of writing."""
        self._scraped()
        sink = TextSink(self.families, headers)
        snapshot = self._snapshot()
        self._emit_process(snapshot, sink)
        runners = list(self.scheduler._runners.values())
        turn = time.perf_counter() + TURN
        for start in range(0, len(runners), STRIDE):
            self._emit_jobs(self._rows(runners[start : start + STRIDE]), snapshot.view, sink)
            if time.perf_counter() >= turn:
                await anyio.lowlevel.checkpoint()
                turn = time.perf_counter() + TURN
        if snapshot.view is not None and self.scheduler.store is not None:
            jobs = list(snapshot.view.jobs.items())
            for start in range(0, len(jobs), STRIDE):
                self._emit_cluster_jobs(jobs[start : start + STRIDE], sink)
                if time.perf_counter() >= turn:
                    await anyio.lowlevel.checkpoint()
                    turn = time.perf_counter() + TURN
        return sink.chunks()

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """While this thread renders the rest of the registry: no figures from
        here (``text()`` wrote them)."""
        self._local.quiet = True
        try:
            yield
        finally:
            self._local.quiet = False

    # -- prometheus_client's collector protocol -----------------------------

    def describe(self) -> Iterator[Metric]:
        return iter(MetricSink(self.families).metrics.values())

    def collect(self) -> Iterator[Metric]:
        if getattr(self._local, "quiet", False):
            return iter(())
        token = self._token
        if token is not None and threading.get_ident() != self._thread:
            # Another thread: the rows are copied on the loop, between its steps.
            with contextlib.suppress(RuntimeError):  # the loop has stopped: nothing changes
                copied = anyio.from_thread.run_sync(self._copy, token=token)
                return self._metrics(*copied)
        return self._metrics(*self._copy())

    def _copy(self) -> tuple[_Snapshot, list[_Row]]:
        self._scraped()
        return self._snapshot(), self._rows(list(self.scheduler._runners.values()))

    def _metrics(self, snapshot: _Snapshot, rows: list[_Row]) -> Iterator[Metric]:
        sink = MetricSink(self.families)
        self._emit_process(snapshot, sink)
        self._emit_jobs(rows, snapshot.view, sink)
        if snapshot.view is not None and self.scheduler.store is not None:
            self._emit_cluster_jobs(list(snapshot.view.jobs.items()), sink)
        return iter(sink.metrics.values())

    # -- the figures: copied on the loop, then emitted into a sink ----------

    def _snapshot(self) -> _Snapshot:
        recorder = self._recorder
        lateness = None
        if recorder is not None and not recorder.lateness.by_job:
            lateness = recorder.lateness.copy("")
        running = self.scheduler._state is not None
        return _Snapshot(running, lateness, self._view, self._store_up)

    def _rows(self, runners: list[JobRunner]) -> list[_Row]:
        now = self.scheduler._ticking_clock.now()
        recorder = self._recorder
        durations = None if recorder is None else recorder.durations
        lateness = None if recorder is None or not recorder.lateness.by_job else recorder.lateness
        rows = []
        for runner in runners:
            name, stats = runner.job.name, runner.stats
            tick = stats.next_run_at
            skipped = stats.skipped
            rows.append(
                _Row(
                    name,
                    stats.runs,
                    stats.running,
                    stats.failures,
                    stats.timeouts,
                    stats.cancelled,
                    None if skipped is None else dict(skipped),
                    stats.retries,
                    runner.busy,
                    tick,
                    None if tick is None else self._interval(runner, tick),
                    runner.store is not None,
                    stats.last_ok_at,
                    # Kept in step with the store's pauses by each heartbeat.
                    runner.paused_until > now,
                    None if durations is None else durations.copy(name),
                    None if lateness is None else lateness.copy(name),
                )
            )
        return rows

    def _emit_process(self, snapshot: _Snapshot, sink: MetricSink | TextSink) -> None:
        if self._recorder is not None and not self.histograms_by_job:
            self._series(sink, self.lateness, (), snapshot.lateness, self._recorder.lateness)
        sink.add(SCHEDULER_RUNNING, "", (), float(snapshot.scheduler_running))
        if self.scheduler.store is None:
            return
        sink.add(STORE_UP, "", (), float(bool(snapshot.store_up)))
        view = snapshot.view
        if view is not None:
            if view.read_at is not None:
                sink.add(READ, "", (), view.read_at)
            sink.add(INSTANCES, "", (), len(view.instances))

    def _emit_jobs(
        self, rows: list[_Row], view: ClusterView | None, sink: MetricSink | TextSink
    ) -> None:
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

    def _process_counters(self, runners: list[_Row], sink: MetricSink | TextSink) -> None:
        for stats in runners:  # each job's JobStats, as copied on the loop
            name = stats.name
            ended = stats.runs - stats.running
            by_outcome = (
                ended - stats.failures - stats.cancelled,
                stats.failures - stats.timeouts,
                stats.timeouts,
                stats.cancelled,
            )
            for outcome, count in zip(OUTCOMES, by_outcome, strict=True):
                sink.add(RUNS, "_total", (name, outcome), count)
            for reason, count in (stats.skipped or {}).items():
                sink.add(SKIPPED, "_total", (name, reason), count)
            sink.add(RETRIES, "_total", (name,), stats.retries)
            sink.add(RUNNING, "", (name,), float(stats.busy))

    @staticmethod
    def _series(
        sink: MetricSink | TextSink,
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
    def _emit_cluster_jobs(
        jobs: list[tuple[str, ClusterJobStatus]], sink: MetricSink | TextSink
    ) -> None:
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
