"""Prometheus metrics of a scheduler: ``instrument(scheduler)``.

Needs prometheus_client (the extra ``fastapi-scheduled-jobs[prometheus]``).
Serve them with the router of the `Metrics`
that ``instrument`` returns (this module has no ``router()``, so do not name
that object ``metrics``)::

    jobs_metrics = instrument(scheduler)
    app.include_router(jobs_metrics.router())

``GET /metrics`` writes the scheduler's figures in slices, with the event
loop's other work in between, and serves a rendering again for ``max_age``
(prometheus_client's ``make_asgi_app`` renders the whole registry in one go on
the loop: about 0.8 s at 5,000 jobs, during which no request was answered; see
docs/development/benchmark-notes.md).

Two kinds of figures (every metric is named ``fastapi_jobs_*``; the job is the
``job_name`` label, as ``job`` is Prometheus's own target label):

* **This process's**: runs by outcome, skipped ticks by reason, retries and
  running, read from the scheduler's own counters when scraped (a tick pays
  nothing for them), and the run durations (a summary per job) and lateness (a
  histogram of the process; both histograms per job with
  ``histograms_by_job=True``), filled by an observer as each run ends. Under
  ``uvicorn --workers N`` each worker reports its own, and a scrape reaches one
  worker: the multiprocess mode (below) sums them.
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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from .._distribution import missing_extra

try:
    from prometheus_client import REGISTRY, CollectorRegistry, values
    from prometheus_client.core import Metric
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise missing_extra(
        "fastapi_jobs.metrics", "prometheus_client", "prometheus", "prometheus_client"
    ) from exc

from .._errors import ConfigurationError, short
from .._scheduler import Scheduler, seam_of
from .._status import ClusterView
from ._recorders import DURATION_BUCKETS, LATENESS_BUCKETS, Counting, Recorder
from ._rows import JobRows, Row, Snapshot, Totals
from ._scrape import Exposition, forget_dead_processes
from ._sinks import Family, MetricSink, TextSink, header

if TYPE_CHECKING:
    from fastapi import APIRouter

__all__ = ["DURATION_BUCKETS", "LATENESS_BUCKETS", "PER_JOB_LIMIT", "Metrics", "instrument"]

PER_JOB_LIMIT = 1000
"""The most jobs whose figures a scrape writes one by one (``instrument``'s
default ``per_job_limit``): about 12,000 series. Past it, this process's counts
are summed over the jobs, and the per-job gauges are left out."""

# The cluster's figures are read every max_age seconds while a scrape came
# within this long; after it, every store.heartbeat seconds.
LINGER = 300.0
# A scrape written by router() lets the event loop run after this long (s) of
# writing, and looks at the time every this many jobs (SUM_STRIDE when summing).
TURN = 0.001
STRIDE = 10
SUM_STRIDE = 200

_log = logging.getLogger("fastapi_jobs.metrics")


def instrument(
    scheduler: Scheduler,
    registry: CollectorRegistry | None = None,
    *,
    max_age: float = 2.0,
    histograms_by_job: bool = False,
    per_job_limit: int | None = PER_JOB_LIMIT,
) -> Metrics:
    """Register the scheduler's metrics in ``registry`` (prometheus_client's
    default one if None) and return their `Metrics`. Call once per
    scheduler and registry, before the app starts, and serve them with its
    router: ``app.include_router(instrument(scheduler).router())``.

    ``max_age``: how old (seconds) the figures may be when scraped: a rendering
    is served again for that long, and with a store, the store is read that
    often while Prometheus scrapes. ``histograms_by_job``: the run durations and
    lateness as histograms per job (``DURATION_BUCKETS``, ``LATENESS_BUCKETS``:
    44 series a job instead of 12); by default a summary of each job's run
    durations (their sum and count) and one lateness histogram for the process.
    ``per_job_limit``: past this many jobs (declared and stored), a scrape sums
    this process's counts over the jobs and leaves out the per-job gauges
    (``fastapi_jobs_per_job_series`` is 0); ``None``: every job's series, however
    many.
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
    if per_job_limit is not None and (
        not isinstance(per_job_limit, int) or isinstance(per_job_limit, bool) or per_job_limit < 0
    ):
        raise ConfigurationError(
            f"instrument(per_job_limit={short(per_job_limit)}): a whole number of jobs, "
            "0 or more, or None for every job's series"
        )
    if seam_of(scheduler).running:
        raise ConfigurationError(
            "instrument() a scheduler before it starts (at import, beside the app): "
            "the store's readings are a task of its lifespan"
        )
    return Metrics(
        scheduler,
        REGISTRY if registry is None else registry,
        float(max_age),
        histograms_by_job,
        per_job_limit,
    )


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
        per_job_limit: int | None = PER_JOB_LIMIT,
    ) -> None:
        self.scheduler = scheduler
        seam = self._seam = seam_of(scheduler)
        self.registry = registry
        self.max_age = max_age
        self.histograms_by_job = histograms_by_job
        self.per_job_limit = per_job_limit
        self._summing = False  # whether the last scrape summed over the jobs
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
        # In multiprocess mode prometheus_client's metrics live in its files, which
        # its collector reads (so they are registered nowhere); else, our arrays.
        self._recorder = None if self.multiprocess else Recorder(histograms_by_job)
        self._rows = JobRows(seam, self._recorder, histograms_by_job)
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
        seam.add_service("metrics", self._serve)

    def router(self, path: str = "/metrics") -> APIRouter:
        """A router with ``GET path`` (``/metrics``): Prometheus's text format or
        OpenMetrics as the scraper asks, gzipped if it accepts it, a rendering
        served again for ``max_age``. Pass the app's own auth with
        ``app.include_router(jobs_metrics.router(), dependencies=[...])``.
        """
        from fastapi import APIRouter, Request, Response

        if self._exposition is None:
            self._exposition = Exposition(self._render, self.max_age, self.multiprocess)
        exposition = self._exposition

        async def scrape(request: Request) -> Response:
            headers = request.headers
            body, content_type, gzipped = await exposition.answer(
                headers.get("accept", ""), headers.get("accept-encoding", "")
            )
            encoded = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if gzipped else None
            return Response(body, headers=encoded, media_type=content_type)

        # FastAPI reads the types from here (the names are not this module's globals).
        scrape.__annotations__ = {"request": Request, "return": Response}
        router = APIRouter()
        router.add_api_route(
            path,
            scrape,
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
                # first scrape (or one every few minutes) is not served old table.
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
        table = self._rows
        runners = self._seam.runners()
        summed = self._summed(len(runners))
        sink = TextSink(table.summed_families if summed else table.families, headers)
        snapshot = table.snapshot(self._view, self._store_up, len(runners), summed)
        table.emit_process(snapshot, sink)
        turn = time.perf_counter() + TURN
        if summed:
            totals = Totals()
            for start in range(0, len(runners), SUM_STRIDE):
                table.add_up(runners[start : start + SUM_STRIDE], totals)
                if time.perf_counter() >= turn:
                    await anyio.lowlevel.checkpoint()
                    turn = time.perf_counter() + TURN
            table.emit_totals(table.closed(totals), sink)
            return sink.chunks()
        for start in range(0, len(runners), STRIDE):
            table.emit_jobs(table.rows(runners[start : start + STRIDE]), snapshot.view, sink)
            if time.perf_counter() >= turn:
                await anyio.lowlevel.checkpoint()
                turn = time.perf_counter() + TURN
        if snapshot.view is not None and self.scheduler.store is not None:
            jobs = list(snapshot.view.jobs.items())
            for start in range(0, len(jobs), STRIDE):
                table.emit_cluster_jobs(jobs[start : start + STRIDE], sink)
                if time.perf_counter() >= turn:
                    await anyio.lowlevel.checkpoint()
                    turn = time.perf_counter() + TURN
        return sink.chunks()

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """While this thread renders the rest of the registry: no figures from
        here (``_text()`` wrote them)."""
        self._local.quiet = True
        try:
            yield
        finally:
            self._local.quiet = False

    # -- prometheus_client's collector protocol -----------------------------

    def describe(self) -> Iterator[Metric]:
        return iter(MetricSink(self._rows.families).metrics.values())

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

    def _summed(self, jobs: int) -> bool:
        """Whether a scrape with ``jobs`` jobs sums their counts; says so in the
        log when that changes."""
        limit = self.per_job_limit
        summed = limit is not None and jobs > limit
        if summed != self._summing:
            self._summing = summed
            if summed:
                _log.warning(
                    "metrics: %d jobs, more than per_job_limit=%d: the counts are summed "
                    "over the jobs and the per-job gauges left out "
                    "(fastapi_jobs_per_job_series 0); instrument(per_job_limit=None) writes "
                    "every job's series",
                    jobs,
                    limit,
                )
            else:
                _log.info(
                    "metrics: %d jobs, per_job_limit=%s: the series are per job again",
                    jobs,
                    limit,
                )
        return summed

    def _copy(self) -> tuple[Snapshot, list[Row] | Totals]:
        self._scraped()
        table = self._rows
        runners = self._seam.runners()
        summed = self._summed(len(runners))
        snapshot = table.snapshot(self._view, self._store_up, len(runners), summed)
        if summed:
            totals = Totals()
            table.add_up(runners, totals)
            return snapshot, table.closed(totals)
        return snapshot, table.rows(runners)

    def _metrics(self, snapshot: Snapshot, rows: list[Row] | Totals) -> Iterator[Metric]:
        table = self._rows
        if isinstance(rows, Totals):
            sink = MetricSink(table.summed_families)
            table.emit_process(snapshot, sink)
            table.emit_totals(rows, sink)
            return iter(sink.metrics.values())
        sink = MetricSink(table.families)
        table.emit_process(snapshot, sink)
        table.emit_jobs(rows, snapshot.view, sink)
        if snapshot.view is not None and self.scheduler.store is not None:
            table.emit_cluster_jobs(list(snapshot.view.jobs.items()), sink)
        return iter(sink.metrics.values())
