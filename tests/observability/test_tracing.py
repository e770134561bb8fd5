"""OpenTelemetry: the spans of runs and the counter of skipped ticks, read back
through the SDK's in-memory exporter and reader (the SDK is a test dependency
only; fastapi_jobs.tracing uses the API)."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from fastapi_jobs import ConfigurationError, Every, JobContext, Scheduler
from fastapi_jobs.stores import SQLAlchemyStore
from fastapi_jobs.tracing import instrument

from ..conftest import HOUR, START, virtual_scheduler

pytestmark = pytest.mark.looptime


def providers() -> tuple[TracerProvider, InMemorySpanExporter, MeterProvider, InMemoryMetricReader]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return tracer_provider, exporter, MeterProvider(metric_readers=[reader]), reader


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def test_each_run_is_a_span_current_for_the_jobs_own_work() -> None:
    tracer_provider, exporter, meter_provider, _ = providers()
    scheduler = virtual_scheduler()
    instrument(scheduler, tracer_provider=tracer_provider, meter_provider=meter_provider)
    inner = tracer_provider.get_tracer("app")

    @scheduler.every(hours=1)
    async def digest(ctx: JobContext) -> None:
        with inner.start_as_current_span("send mail"):
            await anyio.sleep(2)

    async with scheduler.running():
        await anyio.sleep(HOUR + 60)
    spans = exporter.get_finished_spans()
    (run,) = named(spans, "fastapi_jobs.run digest")
    (mail,) = named(spans, "send mail")
    assert mail.parent is not None and mail.parent.span_id == run.context.span_id
    assert run.attributes is not None
    assert dict(run.attributes) == {
        "code.function.name": f"{__name__}.{digest.__qualname__}",
        "fastapi_jobs.job": "digest",
        "fastapi_jobs.tick": (START.replace(hour=1)).isoformat(),
        "fastapi_jobs.manual": False,
        "fastapi_jobs.attempt": 1,
        "fastapi_jobs.instance": scheduler.instance.id,
        "fastapi_jobs.outcome": "ok",
    }
    assert run.status.status_code == StatusCode.UNSET
    assert run.start_time == int((START.timestamp() + HOUR) * 1e9)
    assert run.end_time is not None and run.end_time - run.start_time == 2_000_000_000
    # Nothing of a run stays current after it: the scheduler's own context is clean.
    assert trace.get_current_span() is trace.INVALID_SPAN


@pytest.mark.looptime(False)  # a thread's real time: virtual time would run past it
async def test_a_sync_jobs_thread_runs_in_its_span() -> None:
    tracer_provider, exporter, meter_provider, _ = providers()
    scheduler = Scheduler()
    instrument(scheduler, tracer_provider=tracer_provider, meter_provider=meter_provider)
    inner = tracer_provider.get_tracer("app")
    threads: list[int] = []

    @scheduler.every(hours=1)
    def report() -> None:
        threads.append(threading.get_ident())
        with inner.start_as_current_span("render"):
            pass

    async with scheduler.running():
        result = await scheduler.run_now("report")
    assert result.ok
    (run,) = named(exporter.get_finished_spans(), "fastapi_jobs.run report")
    (render,) = named(exporter.get_finished_spans(), "render")
    assert threads and threads[0] != threading.get_ident()
    assert render.parent is not None and render.parent.span_id == run.context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_a_stored_schedules_span_names_its_task() -> None:
    """A schedule made at run time: ``code.function.name`` is its task's (its job's
    function is the task with the arguments bound)."""
    tracer_provider, exporter, meter_provider, _ = providers()
    scheduler = virtual_scheduler()
    instrument(scheduler, tracer_provider=tracer_provider, meter_provider=meter_provider)

    @scheduler.task()
    async def report(tenant: str) -> None: ...

    async with scheduler.running():
        await scheduler.add_schedule("acme", report, Every(hours=1), kwargs={"tenant": "acme"})
        await anyio.sleep(HOUR + 1)
    (run,) = named(exporter.get_finished_spans(), "fastapi_jobs.run acme")
    assert run.attributes is not None
    assert run.attributes["code.function.name"] == f"{__name__}.{report.__qualname__}"


async def test_a_failed_attempt_is_an_error_span_with_its_exception_and_retries_are_spans_too() -> (
    None
):
    tracer_provider, exporter, meter_provider, _ = providers()
    scheduler = virtual_scheduler()
    instrument(scheduler, tracer_provider=tracer_provider, meter_provider=meter_provider)
    calls: list[int] = []

    @scheduler.every(hours=1, retries=1, retry_backoff=10)
    async def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("smtp refused")

    @scheduler.every(hours=1, timeout=5)
    async def stuck() -> None:
        await anyio.sleep(60)

    async with scheduler.running():
        await anyio.sleep(HOUR + 120)
    spans = exporter.get_finished_spans()
    failed, retried = named(spans, "fastapi_jobs.run flaky")
    assert failed.attributes is not None and retried.attributes is not None
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description == "failed: ConnectionError"
    assert failed.attributes["error.type"] == "ConnectionError"
    assert failed.attributes["fastapi_jobs.outcome"] == "failed"
    (exception,) = failed.events
    assert exception.name == "exception" and exception.attributes is not None
    assert exception.attributes["exception.message"] == "smtp refused"
    assert retried.attributes["fastapi_jobs.attempt"] == 2
    assert retried.attributes["fastapi_jobs.outcome"] == "ok"
    assert retried.status.status_code == StatusCode.UNSET
    (timed_out,) = named(spans, "fastapi_jobs.run stuck")
    assert timed_out.attributes is not None
    assert timed_out.attributes["error.type"] == "TimeoutError"
    assert timed_out.status.description == "timed_out: TimeoutError"


async def test_skipped_ticks_are_counted_not_spans() -> None:
    tracer_provider, exporter, meter_provider, reader = providers()
    scheduler = virtual_scheduler()
    instrument(scheduler, tracer_provider=tracer_provider, meter_provider=meter_provider)

    @scheduler.every(minutes=30)
    async def slow() -> None:
        await anyio.sleep(45 * 60)

    @scheduler.every(minutes=30, paused=True)
    async def held() -> None: ...

    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 60)
    data = reader.get_metrics_data()
    assert data is not None
    (metric,) = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "fastapi_jobs.skipped_ticks"
    ]
    assert isinstance(metric.data, Sum) and metric.data.is_monotonic
    counts = {
        (point.attributes["fastapi_jobs.job"], point.attributes["reason"]): point.value
        for point in metric.data.data_points
        if point.attributes is not None
    }
    assert counts == {("slow", "overlap"): 2, ("held", "paused"): 4}
    assert named(exporter.get_finished_spans(), "fastapi_jobs.run held") == []
    ended, cut = named(exporter.get_finished_spans(), "fastapi_jobs.run slow")
    assert ended.attributes is not None and ended.attributes["fastapi_jobs.outcome"] == "ok"
    assert cut.attributes is not None and cut.attributes["fastapi_jobs.outcome"] == "cancelled"


async def test_a_run_cut_by_shutdown_ends_its_span_and_a_run_by_hand_says_so() -> None:
    tracer_provider, exporter, meter_provider, _ = providers()
    scheduler = virtual_scheduler(shutdown_timeout=1)
    instrument(scheduler, tracer_provider=tracer_provider, meter_provider=meter_provider)

    @scheduler.every(hours=1)
    async def long() -> None:
        await anyio.sleep(HOUR / 2)

    async with scheduler.running():
        await scheduler.trigger("long")
        await anyio.sleep(10)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["fastapi_jobs.manual"] is True
    assert span.attributes["fastapi_jobs.outcome"] == "cancelled"
    assert span.status.status_code == StatusCode.UNSET


async def test_without_an_sdk_the_api_no_op_is_all_it_costs() -> None:
    scheduler = virtual_scheduler()
    tracing = instrument(scheduler)  # the global provider: the API's no-op here
    ran: list[bool] = []

    @scheduler.every(hours=1)
    async def digest() -> None:
        ran.append(not trace.get_current_span().get_span_context().is_valid)

    async with scheduler.running():
        await anyio.sleep(HOUR + 1)
    assert ran == [True] and tracing._going == {}
    with pytest.raises(ConfigurationError, match="give it the Scheduler"):
        instrument("scheduler")  # type: ignore[arg-type]


@pytest.mark.looptime(False)
async def test_a_claimed_runs_span_has_its_fence(tmp_path: Path) -> None:
    tracer_provider, exporter, meter_provider, _ = providers()
    store = SQLAlchemyStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}", timeout=2)
    scheduler = Scheduler(store=store)
    instrument(scheduler, tracer_provider=tracer_provider, meter_provider=meter_provider)
    fences: list[int | None] = []

    @scheduler.every(seconds=1)
    async def digest(ctx: JobContext) -> None:
        fences.append(ctx.fence)

    async with scheduler.running():
        with anyio.fail_after(10):
            while not exporter.get_finished_spans():  # noqa: ASYNC110 - real time
                await anyio.sleep(0.05)
    span = exporter.get_finished_spans()[0]
    assert span.attributes is not None
    assert span.attributes["fastapi_jobs.fence"] == fences[0] == 1


async def test_a_trigger_from_a_request_links_to_its_span_and_later_runs_do_not_inherit_it() -> (
    None
):
    """A job first woken by a request's trigger: its run's span links to the
    request's span instead of being its child, and the later scheduled runs carry
    nothing of that request (no parent, no link)."""
    tracer_provider, exporter, meter_provider, _ = providers()
    scheduler = virtual_scheduler()
    instrument(scheduler, tracer_provider=tracer_provider, meter_provider=meter_provider)
    app_tracer = tracer_provider.get_tracer("app")

    @scheduler.every(hours=1)
    async def digest() -> None:
        await anyio.sleep(1)

    async with scheduler.running():
        with app_tracer.start_as_current_span("POST /jobs/digest/run") as request:
            await scheduler.trigger("digest")
        await anyio.sleep(2 * HOUR + 10)
    triggered, *scheduled = named(exporter.get_finished_spans(), "fastapi_jobs.run digest")
    assert triggered.attributes is not None and triggered.attributes["fastapi_jobs.manual"]
    assert triggered.parent is None
    assert [link.context.span_id for link in triggered.links] == [
        request.get_span_context().span_id
    ]
    assert len(scheduled) == 2
    assert all(span.parent is None and not span.links for span in scheduled)
