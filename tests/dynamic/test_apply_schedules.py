"""Schedules applied as a set (`Scheduler.apply_schedules`), on virtual time:
without a store and on two instances sharing a `MemoryDatabase`; what bad
input gets; the bound on live schedules."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

import anyio
import pytest

from fastapi_jobs import (
    AppliedSchedules,
    ConfigurationError,
    Every,
    JobContext,
    NameTakenError,
    Scheduler,
    ScheduleSpec,
    TooManySchedulesError,
)
from fastapi_jobs.testing import LoopClock, MemoryDatabase, MemoryStore

from ..conftest import START, virtual_scheduler

pytestmark = pytest.mark.looptime

Ran = list[tuple[str, str, float]]


def with_report(ran: Ran, scheduler: Scheduler | None = None) -> Scheduler:
    scheduler = scheduler or virtual_scheduler()

    @scheduler.task()
    async def report(ctx: JobContext, tenant: str) -> None:
        ran.append((ctx.name, tenant, ctx.tick.timestamp() - START.timestamp()))

    return scheduler


def tenants(names: Iterable[str], every: float = 10) -> list[ScheduleSpec]:
    return [
        ScheduleSpec(f"report-{t}", "report", Every(seconds=every), kwargs={"tenant": t})
        for t in names
    ]


async def test_a_set_is_made_changed_and_trimmed_and_runs_as_applied() -> None:
    """The first apply makes every schedule; the next changes what differs and
    removes what it leaves out; the same set again changes nothing."""
    ran: Ran = []
    scheduler = with_report(ran)
    async with scheduler.running():
        first = await scheduler.apply_schedules("reports", tenants(["acme", "globex"]))
        assert first == AppliedSchedules("reports", ("report-acme", "report-globex"), (), (), 0)
        await anyio.sleep(15)  # one tick each, at 10
        second = await scheduler.apply_schedules(
            "reports", [*tenants(["acme"], every=5), *tenants(["initech"])]
        )
        assert second.to_dict() == {
            "group": "reports",
            "created": ["report-initech"],
            "changed": ["report-acme"],
            "removed": ["report-globex"],
            "unchanged": 0,
        }
        versions = {s.name: s.version for s in await scheduler.schedules()}
        again = await scheduler.apply_schedules(
            "reports", [*tenants(["acme"], every=5), *tenants(["initech"])]
        )
        assert (again.created, again.changed, again.removed, again.unchanged) == ((), (), (), 2)
        assert {s.name: s.version for s in await scheduler.schedules()} == versions
        assert {s.group for s in await scheduler.schedules()} == {"reports"}
        await anyio.sleep(12)  # to 27
    assert sorted((name, at) for name, _, at in ran) == [
        ("report-acme", 10.0),
        ("report-acme", 20.0),  # every 5 s from the change at 15
        ("report-acme", 25.0),
        ("report-globex", 10.0),  # removed at 15
        ("report-initech", 20.0),
    ]
    assert ("report-globex", "globex", 10.0) in ran


async def test_a_bad_set_is_refused_whole_saying_what() -> None:
    """A schedule that cannot be, a name given twice, a name another schedule
    holds, a group's name no job could have: refused, nothing applied."""
    scheduler = with_report([])
    async with scheduler.running():
        await scheduler.add_schedule("by-name", "report", Every(seconds=60), kwargs={"tenant": "x"})
        refusals: list[tuple[object, str]] = [
            (
                [*tenants(["a"]), ScheduleSpec("b", "nope", Every(seconds=60))],
                "no task named 'nope'",
            ),
            (tenants(["a", "a"]), "'report-a' is given twice"),
            ([*tenants(["a"]), {"name": "b"}], "is not a ScheduleSpec"),
            (
                [ScheduleSpec("b", "report", Every(seconds=60), kwargs={"tenant": 1, "x": 2})],
                "x",
            ),
        ]
        for given, said in refusals:
            with pytest.raises(ConfigurationError, match=said):
                await scheduler.apply_schedules("g", given)  # type: ignore[arg-type]
        with pytest.raises(NameTakenError, match=r"'by-name'.*nothing was applied"):
            await scheduler.apply_schedules(
                "g", [ScheduleSpec("by-name", "report", Every(seconds=5), kwargs={"tenant": "y"})]
            )
        for group in ("", "a/b", "x" * 201, " g"):
            with pytest.raises(ConfigurationError, match="the group's name"):
                await scheduler.apply_schedules(group, [])
        assert [s.name for s in await scheduler.schedules()] == ["by-name"]


@pytest.mark.parametrize("with_store", [False, True], ids=["no store", "memory store"])
async def test_the_names_taken_are_said_in_good_grammar_one_or_many(with_store: bool) -> None:
    """One name taken outside the group is said in the singular, several in the
    plural, with what to do."""
    clock = LoopClock(START)
    store = MemoryStore(MemoryDatabase(clock)) if with_store else None
    scheduler = with_report([], Scheduler(clock=clock, store=store))
    async with scheduler.running():
        for t in ("a", "b", "c"):
            await scheduler.add_schedule(
                f"report-{t}", "report", Every(seconds=60), kwargs={"tenant": t}
            )
        with pytest.raises(NameTakenError) as one:
            await scheduler.apply_schedules("g", tenants(["a"]))
        with pytest.raises(NameTakenError) as three:
            await scheduler.apply_schedules("g", tenants(["a", "b", "c"]))
    assert str(one.value) == (
        "the name 'report-a' is taken by a live schedule outside group 'g': remove that "
        "schedule, or leave the name out; nothing was applied"
    )
    assert str(three.value) == (
        "3 of the names are taken by live schedules outside group 'g' ('report-a', "
        "'report-b', 'report-c'): remove those schedules, or leave the names out; nothing "
        "was applied"
    )


@pytest.mark.parametrize("with_store", [False, True], ids=["no store", "memory store"])
async def test_the_most_live_schedules_is_a_bound_said_with_the_counts(with_store: bool) -> None:
    """Past ``max_schedules``, add_schedule and a growing set are refused; a set
    that swaps schedules within the bound is not."""
    clock = LoopClock(START)
    store = MemoryStore(MemoryDatabase(clock)) if with_store else None
    scheduler = with_report([], Scheduler(clock=clock, store=store, max_schedules=5))
    async with scheduler.running():
        await scheduler.apply_schedules("g", tenants(["a", "b", "c", "d"]))
        await scheduler.add_schedule("e", "report", Every(seconds=60), kwargs={"tenant": "e"})
        with pytest.raises(TooManySchedulesError, match=r"5 schedule.*1 more.*most is 5") as info:
            await scheduler.add_schedule("f", "report", Every(seconds=60), kwargs={"tenant": "f"})
        assert (info.value.live, info.value.asked, info.value.most) == (5, 1, 5)
        with pytest.raises(TooManySchedulesError, match="2 more"):
            await scheduler.apply_schedules("g", tenants(["a", "b", "c", "d", "x", "y"]))
        swapped = await scheduler.apply_schedules("g", tenants(["w", "x", "y", "z"]))
        assert len(swapped.created) == len(swapped.removed) == 4
        assert len(await scheduler.schedules()) == 5


def test_max_schedules_is_checked_when_the_scheduler_is_built() -> None:
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ConfigurationError, match="max_schedules"):
            Scheduler(max_schedules=bad)  # type: ignore[arg-type]
    Scheduler(max_schedules=None)


async def test_two_instances_run_an_applied_set_once_and_nothing_removed_after_it_returns() -> None:
    """One instance applies while both run: each tick of the set runs once
    across them, and no tick of a removed schedule runs after the apply returned."""
    clock = LoopClock(START)
    database = MemoryDatabase(clock)
    ran: Ran = []
    a, b = (
        with_report(ran, Scheduler(clock=clock, store=MemoryStore(database, heartbeat=1)))
        for _ in range(2)
    )
    names = [f"t{n}" for n in range(50)]
    async with a.running(), b.running():
        await a.apply_schedules("g", tenants(names, every=2))
        await anyio.sleep(9)  # b reads them at its heartbeat
        removed_at = clock.now() - START.timestamp()
        answer = await b.apply_schedules("g", tenants(names[:25], every=2))
        assert len(answer.removed) == 25
        await anyio.sleep(9)
    ticks = Counter((name, at) for name, _, at in ran)
    assert max(ticks.values()) == 1, "a tick ran twice"
    kept = {f"report-{n}" for n in names[:25]}
    assert all(at <= removed_at for (name, at) in ticks if name not in kept)
    late = [at for (name, at) in ticks if name in kept]
    assert max(late) > removed_at + 6  # the kept ones went on
    assert len({(name, at) for (name, at) in ticks if name in kept}) >= 25 * 7


async def test_a_set_is_logged_in_one_line_and_each_schedule_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1,000 schedules applied say what was done in one INFO line, not a thousand."""
    scheduler = with_report([])
    async with scheduler.running():
        with caplog.at_level(logging.DEBUG, logger="fastapi_jobs"):
            await scheduler.apply_schedules("g", tenants([str(n) for n in range(1_000)]))
            await scheduler.apply_schedules("g", tenants([str(n) for n in range(10)]))
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert info == [
        "schedules of group 'g' applied: 1000 made, 0 changed, 0 removed, 0 as they were "
        "(DEBUG logs each)",
        "schedules of group 'g' applied: 0 made, 0 changed, 990 removed, 10 as they were "
        "(DEBUG logs each)",
    ]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert "schedule 'report-999' removed" in debug


async def test_another_instance_reads_a_large_set_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The instance that did not apply a set of 500 logs one INFO line as its
    heartbeat reads them, and runs them."""
    clock = LoopClock(START)
    database = MemoryDatabase(clock)
    a, b = (
        with_report([], Scheduler(clock=clock, store=MemoryStore(database, heartbeat=1)))
        for _ in range(2)
    )
    async with a.running(), b.running():
        await anyio.sleep(1.5)  # both started, their first full reads done
        with caplog.at_level(logging.DEBUG, logger="fastapi_jobs"):
            await a.apply_schedules("g", tenants([str(n) for n in range(500)], every=3600))
            await anyio.sleep(2)
        assert len(b.status()) == 500
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "read 500 changed stored schedule(s) (DEBUG logs each)" in info
    assert not any(m.startswith("schedule 'report-") for m in info)


async def test_paused_in_a_set_holds_where_the_set_makes_or_changes_a_schedule() -> None:
    """``paused`` in a schedule of the set pauses (or resumes) it where the set
    makes or changes it; a schedule left as it was keeps an operator's resume."""
    scheduler = with_report([])
    async with scheduler.running():
        paused = [
            ScheduleSpec("a", "report", Every(seconds=60), {"tenant": "a"}, {"paused": True}),
        ]
        await scheduler.apply_schedules("g", paused)
        assert scheduler.job_status("a").paused
        await scheduler.resume("a")
        again = await scheduler.apply_schedules("g", paused)
        assert again.unchanged == 1 and not scheduler.job_status("a").paused
        changed = [
            ScheduleSpec("a", "report", Every(seconds=30), {"tenant": "a"}, {"paused": True})
        ]
        assert (await scheduler.apply_schedules("g", changed)).changed == ("a",)
        assert scheduler.job_status("a").paused


class HeldClaims(MemoryStore):
    """A memory store whose claims wait for ``hold`` before they are made (a
    slow round trip), so that a change can be applied while one is on its way."""

    hold: anyio.Event | None = None

    async def claim(self, *args: Any, **kwargs: Any) -> dict[str, int | Exception]:
        if self.hold is not None:
            await self.hold.wait()
        return await super().claim(*args, **kwargs)


def _report(tenant: str, every: float = 10) -> list[ScheduleSpec]:
    """The one schedule "report-a", reporting for ``tenant``."""
    return [ScheduleSpec("report-a", "report", Every(seconds=every), kwargs={"tenant": tenant})]


CHANGES = {
    "removed": [],
    "ticks moved": _report("a", every=30),
    "ticks kept": _report("b"),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_a_tick_whose_claim_was_on_its_way_as_its_schedule_changed_runs_only_if_kept(
    change: str,
) -> None:
    """The claim of a tick goes out; the set is applied before it is made: no
    run starts after the apply returned under the old spec. A change that keeps
    the tick runs it once under the new version; one that moves its ticks, or
    removes it, counts it skipped as schedule_changed."""
    clock = LoopClock(START)
    store = HeldClaims(MemoryDatabase(clock))
    ran: Ran = []
    scheduler = with_report(ran, Scheduler(clock=clock, store=store))
    async with scheduler.running():
        await scheduler.apply_schedules("g", _report("a"))
        await anyio.sleep(15)  # tick 10 runs: the job's task serves
        store.hold = anyio.Event()
        await anyio.sleep(5.5)  # the claim of tick 20 is on its way
        await scheduler.apply_schedules("g", CHANGES[change])
        store.hold.set()
        await anyio.sleep(1)
        skipped = scheduler.job_status("report-a").skipped if change != "removed" else None
    if change == "ticks kept":
        assert ran == [("report-a", "a", 10.0), ("report-a", "b", 20.0)]
        assert skipped == {}
    else:
        assert ran == [("report-a", "a", 10.0)]
        assert skipped in (None, {"schedule_changed": 1})


class AnsweredLate(MemoryStore):
    """A memory store that makes each claim at once but answers those of
    ``late`` ticks only when ``answer`` is set (a process too loaded to read its
    answers): the row is held meanwhile."""

    late: frozenset[float] = frozenset()
    answer = anyio.Event()

    async def claim(self, wanted: Any, **kwargs: Any) -> dict[str, int | Exception]:
        made = await super().claim(wanted, **kwargs)
        if any(tick in self.late for _, tick in wanted):
            await self.answer.wait()
        return made


async def tick_10_then_late(
    store: AnsweredLate, scheduler: Scheduler, first: list[ScheduleSpec], *late: float
) -> None:
    """Apply ``first`` and let its tick 10 run; from then on the answers to the
    claims of the ``late`` ticks (seconds after START) wait for ``store.answer``."""
    await scheduler.apply_schedules("g", first)
    await anyio.sleep(15)
    store.answer = anyio.Event()
    store.late = frozenset(START.timestamp() + tick for tick in late)


@pytest.mark.parametrize("answered", ["the old first", "the new first"])
async def test_a_tick_refused_under_a_late_claim_handed_over_unrun_runs_after_all(
    answered: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim of tick 20 is made, its answer late; the set is applied,
    keeping the ticks; tick 30 comes and its claim is refused, since 20's holds
    the row. 20's answer comes after 30 was due: 20 is not run (a later tick of
    the new version is due), and its claim, given back, no longer holds 30
    back: 30 runs, late, under the new version. (Before, 30 ran nowhere, counted
    claimed elsewhere.) Whichever of the two answers is read first."""
    caplog.set_level(logging.INFO, "fastapi_jobs")
    store, ran, scheduler = answered_late()
    async with scheduler.running():
        late = (20,) if answered == "the new first" else (20, 30)
        await tick_10_then_late(store, scheduler, _report("a"), *late)
        await anyio.sleep(10)  # 20's claim is made, unanswered
        await scheduler.apply_schedules("g", _report("b"))
        await anyio.sleep(6)  # 30's claim is refused: 20's holds the row
        store.answer.set()
        await anyio.sleep(20)  # 40 and 50
        status = scheduler.job_status("report-a")
    assert [(tenant, at) for _, tenant, at in ran] == [
        ("a", 10.0),
        ("b", 30.0),
        ("b", 40.0),
        ("b", 50.0),
    ]
    assert "tick 2026-03-02T00:00:20+00:00 was not run: its schedule changed" in caplog.text
    if answered == "the old first":
        assert status.skipped == {"schedule_changed": 1}
    else:  # 30's refusal was read, and counted, before 20's claim was given back
        assert status.skipped == {"schedule_changed": 1, "claimed_elsewhere": 1}


def answered_late() -> tuple[AnsweredLate, Ran, Scheduler]:
    """A scheduler on a store whose answers `AnsweredLate` can hold, with the
    ``report`` task; the runs it notes."""
    clock = LoopClock(START)
    store = AnsweredLate(MemoryDatabase(clock), timeout=20, lease=90)
    ran: Ran = []
    return store, ran, with_report(ran, Scheduler(clock=clock, store=store))


def _replaced(tenant: str) -> list[ScheduleSpec]:
    """ "report-a" every 10 s, whose tick replaces a run (or a claim) in flight."""
    every = Every(seconds=10)
    return [ScheduleSpec("report-a", "report", every, {"tenant": tenant}, {"overlap": "replace"})]


async def test_a_handed_claim_given_back_claims_no_tick_of_a_version_newer_than_it() -> None:
    """Every 10 s, 20's claim answered late; the set is applied at 22 with every
    3 s; 20's answer at 23. 20 is not run, nor 21: a tick of the new version that
    came due before it existed, which nobody claimed. The new version runs from
    24."""
    store, ran, scheduler = answered_late()
    async with scheduler.running():
        await tick_10_then_late(store, scheduler, _report("a"), 20)
        await anyio.sleep(7)
        await scheduler.apply_schedules("g", _report("b", every=3))
        await anyio.sleep(1)
        store.answer.set()
        await anyio.sleep(5.5)
    assert [(tenant, at) for _, tenant, at in ran] == [("a", 10.0), ("b", 24.0), ("b", 27.0)]


async def test_a_tick_held_back_under_the_old_version_runs_under_the_new() -> None:
    """20's claim answered late; 30 comes while the job is busy with that claim
    (counted overlap; refused on any peer); the set is applied at 32, keeping
    the ticks; 20's answer at 33: 30 runs, late. (Its overlap count stays.)"""
    store, ran, scheduler = answered_late()
    async with scheduler.running():
        await tick_10_then_late(store, scheduler, _report("a"), 20)
        await anyio.sleep(17)
        await scheduler.apply_schedules("g", _report("b"))
        await anyio.sleep(1)
        store.answer.set()
        await anyio.sleep(3)
        status = scheduler.job_status("report-a")
    assert [(tenant, at) for _, tenant, at in ran] == [("a", 10.0), ("b", 30.0)]
    assert status.skipped == {"schedule_changed": 1, "overlap": 1}


async def test_a_replace_jobs_tick_run_over_a_handed_claim_is_not_claimed_again() -> None:
    """overlap="replace": the new version's claim of 30 takes the row over from
    20's claim, answered late, and runs; 20's answer at 36 claims nothing again,
    so 30 is not counted claimed elsewhere."""
    store, ran, scheduler = answered_late()
    async with scheduler.running():
        await tick_10_then_late(store, scheduler, _replaced("a"), 20)
        await anyio.sleep(10)
        await scheduler.apply_schedules("g", _replaced("b"))
        await anyio.sleep(11)
        store.answer.set()
        await anyio.sleep(2)
        status = scheduler.job_status("report-a")
    assert [(tenant, at) for _, tenant, at in ran] == [("a", 10.0), ("b", 30.0)]
    assert status.skipped == {"schedule_changed": 1}


async def test_a_claim_handed_over_two_changes_goes_to_the_version_in_force() -> None:
    """20's claim answered late while the set is applied twice (at 25 and 26):
    the claim goes to the runner of the last version, not the retired middle
    one, and 30, refused under it, runs."""
    store, ran, scheduler = answered_late()
    async with scheduler.running():
        await tick_10_then_late(store, scheduler, _report("a"), 20, 30)
        await anyio.sleep(10)
        await scheduler.apply_schedules("g", _report("b"))
        await anyio.sleep(1)
        await scheduler.apply_schedules("g", _report("c"))
        await anyio.sleep(5)
        store.answer.set()
        await anyio.sleep(20)
    assert [(tenant, at) for _, tenant, at in ran] == [
        ("a", 10.0),
        ("c", 30.0),
        ("c", 40.0),
        ("c", 50.0),
    ]


async def test_a_paused_jobs_tick_is_not_claimed_again_after_a_handed_claim() -> None:
    """20's claim answered late; the set is applied at 25, the job paused at 26;
    30 is counted paused, once: 20's answer at 36 claims nothing again."""
    store, ran, scheduler = answered_late()
    async with scheduler.running():
        await tick_10_then_late(store, scheduler, _report("a"), 20)
        await anyio.sleep(10)
        await scheduler.apply_schedules("g", _report("b"))
        await anyio.sleep(1)
        await scheduler.pause("report-a")
        await anyio.sleep(10)
        store.answer.set()
        await anyio.sleep(1)
        status = scheduler.job_status("report-a")
    assert [(tenant, at) for _, tenant, at in ran] == [("a", 10.0)]
    assert status.skipped == {"schedule_changed": 1, "paused": 1}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_a_change_made_elsewhere_under_a_tick_is_told_and_the_tick_kept_runs_once(
    change: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A third instance changes the schedule just before its tick, while the two
    that run it have not read the change (their heartbeat is a minute away):
    both claim the tick under the old version and are refused. Each reads the
    change at once; a change that keeps the tick runs it once, under the new
    version, and the instance that did not run it counts it claimed elsewhere;
    one that moves its ticks (or removes it) is counted schedule_changed on
    each, and said. No instance counts the tick claimed elsewhere when nobody
    ran it."""
    caplog.set_level(logging.INFO, "fastapi_jobs")
    clock = LoopClock(START)
    database = MemoryDatabase(clock)
    ran: Ran = []
    a, b = (
        with_report(ran, Scheduler(clock=clock, store=MemoryStore(database, heartbeat=60)))
        for _ in range(2)
    )
    editor = with_report([], Scheduler(clock=clock, store=MemoryStore(database, heartbeat=60)))
    async with editor.running(ticking=False):
        await editor.apply_schedules("g", _report("a"))
        async with a.running(), b.running():  # each reads it as it starts
            await anyio.sleep(19.5)  # tick 10 runs
            await editor.apply_schedules("g", CHANGES[change])
            await anyio.sleep(5)
            skipped = [s.job_status("report-a").skipped for s in (a, b) if "report-a" in s.jobs]
    assert [(tenant, at) for _, tenant, at in ran if at < 20] == [("a", 10.0)]
    at_20 = [(tenant, at) for _, tenant, at in ran if at == 20]
    elsewhere = sum(s.get("claimed_elsewhere", 0) for s in skipped)
    if change == "ticks kept":
        assert at_20 == [("b", 20.0)]
        # Each run was claimed elsewhere by the other instance, and nothing else.
        assert elsewhere == len(ran) and all(set(s) <= {"claimed_elsewhere"} for s in skipped)
        assert "runs under the schedule's new version" in caplog.text
    else:
        assert at_20 == []
        if change == "ticks moved":
            assert [s.get("schedule_changed") for s in skipped] == [1, 1], skipped
            assert elsewhere == len(ran)  # tick 10's, once: none for tick 20
        assert "its schedule changed since this instance read it" in caplog.text


async def test_python_errors_name_the_place_and_hide_the_values() -> None:
    """A value JSON cannot hold says the schedule's place, never the values (a
    password among them would reach a log); a set that is not a list is said."""
    scheduler = with_report([])
    async with scheduler.running():
        secret = ScheduleSpec(
            "b", "report", Every(seconds=60), {"tenant": "b", "password": "hunter2", "at": START}
        )
        with pytest.raises(ConfigurationError) as info:
            await scheduler.apply_schedules("g", [*tenants(["a"]), secret])
        assert "schedules[1]" in str(info.value) and "hunter2" not in str(info.value)
        for wrong in (None, "report-a", {"a": 1}):
            with pytest.raises(ConfigurationError, match="give a list of ScheduleSpec"):
                await scheduler.apply_schedules("g", wrong)  # type: ignore[arg-type]


async def test_a_schedule_made_again_under_a_paused_name_shows_the_pause_at_once() -> None:
    """A paused schedule is removed by a set and made again by the next: the
    store's pause of its name still holds, and the job says so at once, on the
    instance that applied the set and on the one that read it (not only after
    the next heartbeat), and skips its ticks as paused, not claimed elsewhere."""
    clock = LoopClock(START)
    database = MemoryDatabase(clock)
    a, b = (
        with_report([], Scheduler(clock=clock, store=MemoryStore(database, heartbeat=30)))
        for _ in range(2)
    )
    async with a.running(), b.running():
        await a.apply_schedules("g", _report("a"))
        await a.pause("report-a")
        await anyio.sleep(31)  # b reads the schedule and its pause
        assert b.job_status("report-a").paused
        await a.apply_schedules("g", [])
        await anyio.sleep(30)  # b reads the removal
        assert "report-a" not in b.jobs
        await a.apply_schedules("g", _report("a"))
        assert a.job_status("report-a").paused
        await anyio.sleep(30.5)  # b reads it made again, at 91.5: its tick 90 was due before
        assert b.job_status("report-a").paused
        await anyio.sleep(20)  # ticks 100 and 110
        skipped = [s.job_status("report-a").skipped for s in (a, b)]
    # a made it again at 61: its ticks 70 to 110; b from 91.5: 100 and 110.
    assert skipped == [{"paused": 5}, {"paused": 2}], skipped
