"""Counters only rise: this process's counts, per job or summed over the jobs,
through stored schedules removed, changed and made again under their names,
and through the switches across per_job_limit (virtual time, a MemoryStore)."""

from __future__ import annotations

import anyio
import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fastapi_jobs import Cron, Every, JobContext, Scheduler, ScheduleSpec
from fastapi_jobs._dynamic.stored import ScheduleOptions
from fastapi_jobs.metrics import Metrics, _ledger, instrument
from fastapi_jobs.testing import MemoryStore

from ..conftest import virtual_scheduler

pytestmark = pytest.mark.looptime

WHILE = 180.0  # three ticks of each job

Key = tuple[str, tuple[tuple[str, str], ...]]
_COUNTED = ("counter", "histogram", "summary")


class Rising:
    """Every counter sample scraped (runs, skips, retries, the histograms'
    buckets, counts and sums), with the value it last had: a scrape that
    shows one lower fails, even after the series was gone for a while."""

    def __init__(self, metrics: Metrics, registry: CollectorRegistry) -> None:
        self.metrics, self.registry = metrics, registry
        self.seen: dict[Key, float] = {}

    async def scrape(self) -> dict[Key, float]:
        """Both ways a scrape is written (the router's, prometheus_client's), each
        checked (the router's lets the loop run: runs may end meanwhile)."""
        routed = b"".join(await self.metrics._render(generate_latest, CONTENT_TYPE_LATEST))
        self.check(routed.decode())
        return self.check(generate_latest(self.registry).decode())

    def check(self, text: str) -> dict[Key, float]:
        samples: dict[Key, float] = {}
        for family in text_string_to_metric_families(text):
            if family.type not in _COUNTED or not family.name.startswith("fastapi_jobs_"):
                continue
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                before = self.seen.get(key)
                assert before is None or sample.value >= before, (
                    f"{key} went down from {before} to {sample.value}"
                )
                self.seen[key] = samples[key] = sample.value
        return samples


def summed(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples.get((f"fastapi_jobs_{name}", tuple(sorted(labels.items()))), 0.0)


def with_work() -> Scheduler:
    """A scheduler with one declared job and a task whose kind says how it ends:
    ok, failed (retried once), or slow (its next ticks dropped as overlap)."""
    scheduler = virtual_scheduler(store=MemoryStore())

    @scheduler.every(minutes=1)
    async def digest() -> None: ...

    @scheduler.task
    async def work(ctx: JobContext, kind: str) -> None:
        if kind == "failed":
            raise ConnectionError("smtp refused")
        if kind == "slow":
            await anyio.sleep(150)

    return scheduler


def spec(name: str, kind: str) -> ScheduleSpec:
    """A schedule of ``work`` each minute; a failing one is retried once."""
    retried: ScheduleOptions = {"retries": 1, "retry_backoff": 1}
    options = retried if kind == "failed" else None
    return ScheduleSpec(name, "work", Every(minutes=1), kwargs={"kind": kind}, options=options)


async def add(scheduler: Scheduler, name: str, kind: str) -> None:
    made = spec(name, kind)
    await scheduler.add_schedule(
        name, "work", made.schedule, kwargs=made.kwargs, **(made.options or {})
    )


@pytest.mark.parametrize(("limit", "histograms"), [(4, False), (4, True), (0, True), (None, False)])
async def test_no_counter_goes_down_as_schedules_come_and_go(
    limit: int | None, histograms: bool
) -> None:
    """Through removals (with a run in flight), re-creations under the same
    names, a schedule's change, sets applied and emptied, and the switches
    across per_job_limit both ways, no counter sample ever shows less than
    it did, and the sums keep the removed jobs' counts."""
    scheduler = with_work()
    registry = CollectorRegistry()
    metrics = instrument(
        scheduler, registry, max_age=WHILE, histograms_by_job=histograms, per_job_limit=limit
    )
    rising = Rising(metrics, registry)
    async with scheduler.running():
        for name, kind in (("a", "ok"), ("b", "failed"), ("c", "slow")):
            await add(scheduler, name, kind)
        await anyio.sleep(WHILE)
        first = await rising.scrape()  # 4 jobs: per job up to the limit
        for name, kind in (("d", "ok"), ("e", "failed")):
            await add(scheduler, name, kind)
        await anyio.sleep(WHILE)
        before = await rising.scrape()  # 6 jobs: summed past the limit
        for name in ("b", "d", "e"):
            await scheduler.remove_schedule(name)
        await rising.scrape()  # 3: per job again, b's series gone
        await anyio.sleep(WHILE)
        await rising.scrape()
        for name, kind in (("b", "failed"), ("d", "ok"), ("e", "failed")):
            await add(scheduler, name, kind)  # the same names again
        await rising.scrape()
        await anyio.sleep(WHILE)
        await rising.scrape()
        for name in ("d", "e"):
            await scheduler.remove_schedule(name)
        await rising.scrape()  # b per job again, from where it was
        await scheduler.update_schedule("a", schedule=Every(seconds=30))
        await rising.scrape()
        await anyio.sleep(WHILE + 60)  # c is running
        assert scheduler.job_status("c").running
        await scheduler.remove_schedule("c")
        await rising.scrape()
        await anyio.sleep(WHILE)  # its run ends, removed
        await rising.scrape()
        await add(scheduler, "c", "slow")
        tenants = [spec(f"t{k}", ("ok", "failed", "slow")[k % 3]) for k in range(6)]
        for _ in range(2):
            await scheduler.apply_schedules("tenants", tenants)
            await rising.scrape()
            await anyio.sleep(WHILE)
            await rising.scrape()
            await scheduler.apply_schedules("tenants", [])
            await rising.scrape()
            await anyio.sleep(WHILE)
        last = await rising.scrape()
    await rising.scrape()  # stopped: the runs cut by the stop counted
    if limit == 0:
        # Summed throughout: the removed jobs' runs are still in the sums.
        assert summed(last, "runs_total", outcome="ok") > summed(before, "runs_total", outcome="ok")
        assert summed(last, "runs_total", outcome="failed") > summed(
            before, "runs_total", outcome="failed"
        )
        assert summed(last, "skipped_ticks_total", reason="overlap") > 0
    if limit is None:
        # Per job throughout: b came back counting on from its earlier runs.
        was = summed(first, "runs_total", job_name="b", outcome="failed")
        assert summed(last, "runs_total", job_name="b", outcome="failed") > was > 0


async def test_what_jobs_that_left_counted_is_kept_in_bounded_memory() -> None:
    """Jobs that come and go (tenants) are summed into one total; by name,
    only the last few are kept (with their durations' cells), and one made
    again is kept while it lives: it counts on, a forgotten one starts from 0."""
    scheduler = with_work()
    registry = CollectorRegistry()
    metrics = instrument(
        scheduler, registry, max_age=WHILE, histograms_by_job=True, per_job_limit=None
    )
    ledger, recorder = metrics._rows.ledger, metrics._recorder
    assert ledger is not None and recorder is not None and ledger.most == _ledger.REMEMBERED
    ledger.most = 5
    rising = Rising(metrics, registry)

    async def churn(tenants: range) -> None:
        for k in tenants:
            await add(scheduler, f"tenant{k}", "ok")
            await anyio.sleep(90)  # runs once (or twice: a tick as it leaves)
            await scheduler.remove_schedule(f"tenant{k}")

    async with scheduler.running():
        await churn(range(40))
        await rising.scrape()
        kept = list(ledger.remembered)
        assert len(kept) == 5 and ledger.carried == {}
        assert ledger.parked.outcomes[0] >= 40
        assert set(recorder.durations.cells) == set(recorder.lateness.cells) == {"digest", *kept}
        forgotten = next(f"tenant{k}" for k in range(40) if f"tenant{k}" not in kept)
        revived = kept[0]
        before = ledger.remembered[revived].outcomes[0]
        for name in (revived, forgotten):
            await add(scheduler, name, "ok")
        await churn(range(40, 50))  # pushes the revived one's name out: carried instead
        samples = await rising.scrape()
        ran = scheduler.job_status(revived).runs, scheduler.job_status(forgotten).runs
        assert ledger.carried.keys() == {revived} and len(ledger.remembered) == 5
    assert summed(samples, "runs_total", job_name=revived, outcome="ok") == before + ran[0]
    assert summed(samples, "runs_total", job_name=forgotten, outcome="ok") == ran[1]
    assert summed(samples, "runs_total", outcome="ok") == 0  # per job only


async def test_a_removed_cron_jobs_interval_is_not_kept() -> None:
    """The gap between a cron job's ticks, kept by name between scrapes, goes
    with its stored schedule."""
    scheduler = with_work()
    registry = CollectorRegistry()
    metrics = instrument(scheduler, registry, max_age=WHILE)
    async with scheduler.running():
        for k in range(3):
            await scheduler.add_schedule(
                f"cron{k}", "work", Cron("*/5 * * * *"), kwargs={"kind": "ok"}
            )
        await Rising(metrics, registry).scrape()
        assert set(metrics._rows._intervals) == {"cron0", "cron1", "cron2"}
        for k in range(3):
            await scheduler.remove_schedule(f"cron{k}")
        assert metrics._rows._intervals == {}


async def test_a_virtual_block_keeps_the_counters_of_the_runs_before_it() -> None:
    """`testing.virtual` starts the jobs afresh: the metrics keep what they
    counted before it, and count on from there, in the block and after it."""
    from datetime import UTC, datetime

    from fastapi_jobs.testing import virtual

    scheduler = with_work()
    registry = CollectorRegistry()
    rising = Rising(instrument(scheduler, registry=registry), registry)
    for _ in range(2):
        await scheduler.run_now("digest")
    before = summed(await rising.scrape(), "runs_total", job_name="digest", outcome="ok")
    with virtual(scheduler, datetime(2026, 3, 2, tzinfo=UTC)):
        assert scheduler.job_status("digest").runs == 0
        await scheduler.run_now("digest")
        inside = summed(await rising.scrape(), "runs_total", job_name="digest", outcome="ok")
    after = summed(await rising.scrape(), "runs_total", job_name="digest", outcome="ok")
    assert (before, inside, after) == (2, 3, 3)
