"""OpenTelemetry spans of a scheduler's runs: ``instrument(scheduler)``.

Needs the OpenTelemetry API only (the extra ``fastapi-scheduled-jobs[otel]``); the
app brings its SDK and exporter as for the rest of its tracing. Without one,
the API's no-op tracer costs a few microseconds per run, and nothing else.

Each run (each attempt) is a span ``fastapi_jobs.run <job>``, current while
the job runs, so what the job does (its queries, its HTTP calls) nests under
it. Its attributes: ``code.function.name`` (the job's function; a stored
schedule's task), ``fastapi_jobs.job``, ``.tick`` (ISO 8601), ``.manual``,
``.attempt``, ``.fence`` (claimed runs), ``.instance`` and ``.outcome``; a failed or
timed-out run has status ERROR, ``error.type`` and the exception recorded. A
lost lease is an event on the run's span. The attributes are set once the span
has started (a sampler sees the span's name and kind), and only on a span that
records. Skipped ticks are not spans: they
count in the ``fastapi_jobs.skipped_ticks`` counter (by job and reason) of the
OpenTelemetry metrics API.
"""

from __future__ import annotations

from functools import partial
from importlib.metadata import PackageNotFoundError, version

from ._clock import as_datetime
from ._distribution import NAME, missing_extra

try:
    from opentelemetry import context, metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise missing_extra(
        "fastapi_jobs.tracing", "the OpenTelemetry API", "otel", "opentelemetry-api"
    ) from exc

from ._core.observers import LeaseLost, RunFinished, RunStarted, TickSkipped
from ._errors import ConfigurationError, short
from ._scheduler import Scheduler

__all__ = ["Tracing", "instrument"]

_NS = 1_000_000_000
try:
    _VERSION = version(NAME)
except PackageNotFoundError:  # pragma: no cover - run from a source tree
    _VERSION = "0"


def instrument(
    scheduler: Scheduler,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> Tracing:
    """Trace the scheduler's runs (the global providers unless given)."""
    if not isinstance(scheduler, Scheduler):
        raise ConfigurationError(f"instrument({short(scheduler)}): give it the Scheduler")
    tracing = Tracing(scheduler, tracer_provider, meter_provider)
    scheduler.add_observer(tracing)
    return tracing


class Tracing:
    """The observer ``instrument()`` adds: a span per run, a counter of skips."""

    def __init__(
        self,
        scheduler: Scheduler,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
    ) -> None:
        self.scheduler = scheduler
        self.tracer = trace.get_tracer("fastapi_jobs", _VERSION, tracer_provider=tracer_provider)
        meter = metrics.get_meter("fastapi_jobs", _VERSION, meter_provider=meter_provider)
        self.skips = meter.create_counter(
            "fastapi_jobs.skipped_ticks",
            unit="{tick}",
            description="Ticks that did not run in this process, by job and reason.",
        )
        # The run going in each job (one at a time per process): its span, and
        # the token that made it current.
        self._going: dict[str, tuple[trace.Span, object]] = {}
        self._functions: dict[str, str] = {}

    def _function(self, job: str) -> str:
        name = self._functions.get(job)
        if name is None:
            found = self.scheduler.jobs.get(job)
            func = None if found is None else found.func
            while isinstance(func, partial):  # a stored schedule's: its task
                func = func.func
            name = self._functions[job] = (
                job
                if func is None
                else f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', job)}"
            )
        return name

    def run_started(self, event: RunStarted) -> None:
        links = None
        if event.asked_from is not None:
            # A run asked for by a request links to the request's span; its parent
            # is the scheduler's context, as for any run (the request has ended
            # long before a long run does).
            asked = event.asked_from.run(trace.get_current_span).get_span_context()
            if asked.is_valid:
                links = [trace.Link(asked)]
        span = self.tracer.start_span(
            f"fastapi_jobs.run {event.job}",
            kind=SpanKind.INTERNAL,
            start_time=int(event.started * _NS),
            links=links,
        )
        if span.is_recording():
            attributes: dict[str, str | int | bool] = {
                "code.function.name": self._function(event.job),
                "fastapi_jobs.job": event.job,
                "fastapi_jobs.tick": as_datetime(event.tick).isoformat(),
                "fastapi_jobs.manual": event.manual,
                "fastapi_jobs.attempt": event.attempt,
                "fastapi_jobs.instance": event.instance,
            }
            if event.fence is not None:
                attributes["fastapi_jobs.fence"] = event.fence
            span.set_attributes(attributes)
        elif not span.get_span_context().is_valid:
            return  # the API's no-op (no SDK): nothing to record, nothing to carry
        # Called in the job's own task just before the job: the span is current
        # for the run (and for a sync job's thread, which copies the context). A
        # span sampled out is current too: what the job starts is sampled out alike.
        token = context.attach(trace.set_span_in_context(span))
        self._going[event.job] = (span, token)

    def run_finished(self, event: RunFinished) -> None:
        going = self._going.pop(event.job, None)
        if going is None:
            return  # the API's no-op
        span, token = going
        context.detach(token)  # type: ignore[arg-type]
        if not span.is_recording():
            return
        span.set_attribute("fastapi_jobs.outcome", event.outcome)
        error = event.error
        if event.outcome in ("failed", "timed_out"):
            kind = "TimeoutError" if error is None else type(error).__qualname__
            span.set_attribute("error.type", kind)
            if error is not None:
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{event.outcome}: {kind}"))
        span.end(end_time=int((event.started + event.duration_s) * _NS))

    def lease_lost(self, event: LeaseLost) -> None:
        going = self._going.get(event.job)
        if going is not None:
            going[0].add_event(
                "fastapi_jobs.lease_lost",
                {"fastapi_jobs.fence": event.fence, "fastapi_jobs.reason": event.reason},
            )

    def tick_skipped(self, event: TickSkipped) -> None:
        self.skips.add(event.ticks, {"fastapi_jobs.job": event.job, "reason": event.reason})
