"""Claims of an instant for a set of jobs: the jobs due together on every
instance are claimed by the instance that claims their instant first; the
others send no claim of theirs. The store's calls on every backend, then
schedulers sharing a database."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs import Every, JobContext, Scheduler, SystemClock, TickAheadError
from fastapi_jobs._clock import OffsetClock
from fastapi_jobs._core.claims import LANDED_FOR, Claims
from fastapi_jobs._core.dispatcher import GROUP_FROM
from fastapi_jobs._core.heartbeat import Heartbeat
from fastapi_jobs._store import FUTURE_MARGIN, Ended
from fastapi_jobs.observers import TickSkipped
from fastapi_jobs.stores import Instance, SQLAlchemyStore
from fastapi_jobs.testing import MemoryStore

from ..conftest import claim1, open_store
from ..support.instances import Seeing, engine_for, instance
from ..support.postgres import PostgresServer
from ..support.waiting import poll

JOBS = [f"job{i}" for i in range(GROUP_FROM + 2)]
KEY = "k" * 32


async def release_all(store: SQLAlchemyStore, fences: Mapping[str, int | Exception]) -> None:
    ended = [Ended(job, f, "ok", None, 0.0) for job, f in fences.items() if isinstance(f, int)]
    assert len(ended) == len(fences)
    assert not await store.release(ended)


def claims_sent(listen: Callable[[Callable[..., None]], None]) -> Counter[str]:
    """The claim statements sent from now on, by the table they claim in."""
    sent: Counter[str] = Counter()

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        for table in ("fastapi_jobs_claims", "fastapi_jobs_instants"):
            if f"INSERT INTO {table}" in statement:
                sent[table] += 1

    listen(count)
    return sent


async def test_the_first_to_claim_an_instant_claims_its_set_and_the_others_send_nothing(
    database_url: str, on_statement: Callable[[Callable[..., None]], None]
) -> None:
    engine = create_async_engine(database_url)
    sent = claims_sent(on_statement)
    tick = time.time() - 1
    wanted = [(job, tick) for job in JOBS]
    try:
        async with open_store(engine) as a, open_store(engine) as b:
            first = await a.claim(wanted, instant=(KEY, tick, frozenset(JOBS)))
            assert sorted(first) == JOBS
            assert sent == {"fastapi_jobs_instants": 1, "fastapi_jobs_claims": 1}
            # The same instant of the same set: nothing claimed, no claim sent.
            assert await b.claim(wanted, instant=(KEY, tick, frozenset(JOBS))) == {}
            assert sent == {"fastapi_jobs_instants": 2, "fastapi_jobs_claims": 1}
            # An older instant neither.
            older = [(job, tick - 1) for job in JOBS]
            assert await b.claim(older, instant=(KEY, tick - 1, frozenset(JOBS))) == {}
            await release_all(a, first)
            # The set's next instant goes to whoever claims it first: b, now.
            later = [(job, tick + 0.5) for job in JOBS]
            assert sorted(await b.claim(later, instant=(KEY, tick + 0.5, frozenset(JOBS)))) == JOBS
            assert await a.claim(later, instant=(KEY, tick + 0.5, frozenset(JOBS))) == {}
            async with engine.connect() as conn:
                c, i = a.tables.claims, a.tables.instants
                owners = set((await conn.execute(sa.select(c.c.owner))).scalars())
                row = (await conn.execute(sa.select(i.c.key, i.c.instant, i.c.owner))).one()
    finally:
        await engine.dispose()
    assert owners == {b._owner}
    assert tuple(row) == (KEY, tick + 0.5, b._owner)


async def test_an_instant_decides_nothing_the_jobs_own_claims_do(database_url: str) -> None:
    """Two instances whose sets differ (a deploy adds a job) both claim their
    instant: each job's own claim still makes its tick run once, and a job
    outside the set is claimed whatever became of the instant."""
    engine = create_async_engine(database_url)
    tick = time.time() - 1
    try:
        async with open_store(engine) as old, open_store(engine) as new:
            made = await old.claim([(j, tick) for j in JOBS], instant=(KEY, tick, frozenset(JOBS)))
            assert sorted(made) == JOBS
            await release_all(old, made)
            # Another set (another key) at the same instant: its instant is claimed,
            # its jobs' ticks are not (they were), the new job's is.
            wanted = [(j, tick) for j in [*JOBS, "added"]]
            assert list(await new.claim(wanted, instant=("n" * 32, tick, frozenset(JOBS)))) == [
                "added"
            ]
            await new.release([Ended("added", 1, "ok", None, 0.0)])
            # The set's next instant: old claims it (and a job outside the set,
            # a hand-off, say); new loses it, but claims its job outside the set.
            later = [(j, tick + 0.5) for j in [*JOBS, "handoff"]]
            got = await old.claim(later, instant=(KEY, tick + 0.5, frozenset(JOBS)))
            assert sorted(got) == sorted([*JOBS, "handoff"])
            wanted = [(j, tick + 0.5) for j in [*JOBS, "added"]]
            got = await new.claim(wanted, instant=(KEY, tick + 0.5, frozenset(JOBS)))
            assert got == {"added": 2}
    finally:
        await engine.dispose()


async def test_an_instant_ahead_of_the_database_clock_is_not_claimed(database_url: str) -> None:
    """A host whose clock jumped ahead cannot take a set's next instants from
    the others: its instant is refused as its claims would be, each job's answer
    saying why (the tick is ahead of the database's clock)."""
    engine = create_async_engine(database_url)
    now = time.time()
    try:
        async with open_store(engine) as ahead, open_store(engine) as on_time:
            future = [(j, now + 3600) for j in JOBS]
            refused = await ahead.claim(future, instant=(KEY, now + 3600, frozenset(JOBS)))
            assert sorted(refused) == JOBS
            assert all(isinstance(why, TickAheadError) for why in refused.values())
            wanted = [(j, now - 1) for j in JOBS]
            assert sorted(await on_time.claim(wanted, instant=(KEY, now - 1, frozenset(JOBS)))) == (
                JOBS
            )
    finally:
        await engine.dispose()


async def test_a_store_made_before_the_instants_sends_every_claim(database_url: str) -> None:
    """``create_tables=False`` on the tables of a release before the instants:
    every claim is sent (and decides, as before)."""
    engine = create_async_engine(database_url)
    try:
        name = await instants_replaced(engine)
        await claims_as_before(engine)
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
    finally:
        await engine.dispose()
    assert name not in names


async def instants_replaced(engine: Any, made_as: str | None = None) -> str:
    """The store's tables made, then its instants table dropped (and made again
    as ``made_as``, a column list, if given): a migration's. Its name."""
    async with open_store(engine) as made:
        name = made.tables.instants.name
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"DROP TABLE {name}")
        if made_as is not None:
            await conn.exec_driver_sql(f"CREATE TABLE {name} ({made_as})")
    return name


async def claims_as_before(engine: Any) -> None:
    """Two stores with ``create_tables=False`` claim an instant's jobs: every
    claim is sent and the jobs' rows decide, as before the instants."""
    tick = time.time() - 1
    wanted = [(j, tick) for j in JOBS]
    async with (
        open_store(engine, create_tables=False) as a,
        open_store(engine, create_tables=False) as b,
    ):
        assert sorted(await a.claim(wanted, instant=(KEY, tick, frozenset(JOBS)))) == JOBS
        assert await b.claim(wanted, instant=(KEY, tick, frozenset(JOBS))) == {}
        await a.prune()  # nothing to prune in the instants: no error either


def test_a_set_is_named_by_its_jobs_and_the_versions_of_its_stored_schedules() -> None:
    claims = Claims(SQLAlchemyStore("sqlite+aiosqlite:///unused.sqlite3"), logging.getLogger("t"))
    first = claims.instant(["b", "a", "c"], 10.0, ["a"])
    assert first is not None
    key, at, jobs = first
    assert (at, jobs) == (10.0, frozenset({"a"}))
    assert len(key) == 32 and key == claims.instant(["c", "a", "b"], 11.0, ["b"])[0]  # type: ignore[index]
    assert key != claims.instant(["a", "b"], 10.0, ["a"])[0]  # type: ignore[index]
    # Names that would join alike are told apart.
    assert claims.instant(["a,b"], 1.0, ["a,b"]) != claims.instant(["a", "b"], 1.0, ["a"])
    claims.versions = {"a": 7}
    assert claims.instant(["a", "b", "c"], 10.0, ["a"])[0] != key  # type: ignore[index]
    assert claims.instant(["a", "b", "c"], 10.0, []) is None
    # A store of one's own without instant claims: every claim goes.
    own = Claims(MemoryStore(), logging.getLogger("t"))
    assert own.instant(["a", "b", "c"], 10.0, ["a"]) is None


INTERVAL = 0.2


def ticking_many(
    engine: Any,
    ran: list[tuple[str, float]],
    names: list[str],
    seen: list[TickSkipped],
    **store_options: object,
) -> Scheduler:
    scheduler = instance(engine, **store_options)
    scheduler.add_observer(Seeing(seen))
    for name in names:

        async def job(ctx: JobContext) -> None:
            ran.append((ctx.name, ctx.tick.timestamp()))

        scheduler.add_job(job, Every(seconds=INTERVAL), name=name)
    return scheduler


def assert_accounted(
    ran: list[tuple[str, float]], seen: list[TickSkipped], jobs: list[str]
) -> None:
    """No (job, tick) ran twice; and every tick between the first and the last run
    of each job ran once, or an instance said why it did not run it (a tick it was
    late for, a store it could not reach): none is lost to the instants."""
    counts = Counter(ran)
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1]
    said = {
        (event.job, round(event.tick + k * INTERVAL, 3))
        for event in seen
        if event.tick is not None and event.reason != "claimed_elsewhere"
        for k in range(event.ticks)
    }
    for job in jobs:
        ticks = sorted(tick for name, tick in ran if name == job)
        assert len(ticks) >= 6, (job, ticks)
        due = Every(seconds=INTERVAL).ticks_between(ticks[0], ticks[-1])[0]
        between = [round(ticks[0] + k * INTERVAL, 3) for k in range(1, due)]
        left_out = [t for t in between if not any(abs(t - r) < 1e-3 for r in ticks)]
        assert all((job, t) in said for t in left_out), (job, left_out, seen)


def ran_six(ran: list[tuple[str, float]], jobs: list[str]) -> bool:
    """Each of ``jobs`` ran six ticks or more."""
    counts = Counter(name for name, _ in ran)
    return all(counts[job] >= 6 for job in jobs)


def lost_six(seen: list[TickSkipped]) -> bool:
    """Six instants or more were claimed by one instance and lost by the other."""
    return len({(e.instance, e.tick) for e in seen if e.reason == "claimed_elsewhere"}) >= 6


async def test_instances_with_the_same_jobs_send_one_instants_claims(
    cluster_url: str, on_statement: Callable[[Callable[..., None]], None]
) -> None:
    """Two instances with the same jobs: every tick runs once, and each instant's
    claims are sent by one of them (a claim statement per instant, not two)."""
    ran: list[tuple[str, float]] = []
    seen: list[TickSkipped] = []
    async with engine_for(cluster_url) as engine:
        a, b = ticking_many(engine, ran, JOBS, seen), ticking_many(engine, ran, JOBS, seen)
        async with a.running({"db": engine}), b.running({"db": engine}):
            # Both running, their first instants claimed: one has lost an instant.
            await poll(lambda: any(e.reason == "claimed_elsewhere" for e in seen))
            sent = claims_sent(on_statement)
            # However long a loaded machine takes: six instants won and six lost.
            await poll(lambda: sent["fastapi_jobs_instants"] >= 2 * 6 and lost_six(seen))
            await poll(lambda: ran_six(ran, JOBS))
            window = Counter(sent)
    assert_accounted(ran, seen, JOBS)
    instants = window["fastapi_jobs_instants"]
    assert instants >= 2 * 6, window  # both claim each instant
    # One claim per instant (the window's edges may cut an instant's statements
    # in two: one more); an instance that wakes late for an instant (its loop
    # stalled past the next tick) claims the latest tick job by job; and one
    # whose claim of a job's tick before had no answer yet (skipped as overlap:
    # a loaded machine's SQLite lock) leaves the job out of its set, so the two
    # sets differ and each instance sends its claims for that instant.
    late = len({(e.instance, e.tick) for e in seen if e.reason == "missed"})
    split = len({e.tick for e in seen if e.reason == "overlap"})
    most = (instants + 1) // 2 + 1 + late + split
    assert window["fastapi_jobs_claims"] <= most, (window, late, split)
    lost = [e for e in seen if e.reason == "claimed_elsewhere"]
    assert len({(e.instance, e.tick) for e in lost}) >= 6, lost


async def test_instances_whose_jobs_differ_each_run_their_own(cluster_url: str) -> None:
    """A deploy in progress: one instance has a job more. The sets differ, so
    both instances claim every instant, and each tick of each job still runs once."""
    ran: list[tuple[str, float]] = []
    seen: list[TickSkipped] = []
    async with engine_for(cluster_url) as engine:
        old = ticking_many(engine, ran, JOBS, seen)
        new = ticking_many(engine, ran, [*JOBS, "added"], seen)
        async with old.running({"db": engine}), new.running({"db": engine}):
            await poll(lambda: ran_six(ran, [*JOBS, "added"]))
    assert_accounted(ran, seen, [*JOBS, "added"])


class LateReleases(SQLAlchemyStore):
    """A store whose releases fail while ``failing`` (a connection lost, say),
    and whose claims that carry releases reach the database a moment late: the
    instance whose releases did not land is the slower to claim the next instant."""

    failing: ClassVar[list[bool]] = []  # shared by the instances of a test

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        if self.failing:
            raise ConnectionError("the release was lost")
        return await super().release(ended)

    async def release_then_claim(
        self, ended: Sequence[Ended], wanted: Sequence[tuple[str, float]], **given: Any
    ) -> tuple[dict[str, Exception], dict[str, int | Exception]]:
        await anyio.sleep(0.03)
        return await super().release_then_claim(ended, wanted, **given)


async def test_a_release_that_did_not_land_costs_no_tick(cluster_url: str) -> None:
    """The instance that ran a set's tick and could not release it claims the
    set's next tick job by job, after its releases: the other instance, claiming
    the instant first, finds those jobs' leases still held; skipping them as the
    loser of the instant would lose the tick (the newcomer's finding)."""
    ran: list[tuple[str, float]] = []
    seen: list[TickSkipped] = []
    LateReleases.failing = []
    async with engine_for(cluster_url) as engine:
        instances = []
        for _ in range(2):
            scheduler = Scheduler(store=LateReleases(lambda state: state["db"]), shutdown_timeout=5)
            scheduler.add_observer(Seeing(seen))
            for name in JOBS:

                async def job(ctx: JobContext) -> None:
                    ran.append((ctx.name, ctx.tick.timestamp()))

                scheduler.add_job(job, Every(seconds=INTERVAL), name=name)
            instances.append(scheduler)
        a, b = instances
        async with a.running({"db": engine}), b.running({"db": engine}):
            await anyio.sleep(0.5)
            for _ in range(3):  # a release lost, then the tick after it
                LateReleases.failing.append(True)
                await anyio.sleep(INTERVAL)
                LateReleases.failing.clear()
                await anyio.sleep(2 * INTERVAL)
            await anyio.sleep(0.3)
    assert_accounted(ran, seen, JOBS)


async def test_a_resume_made_elsewhere_is_run_by_whoever_heard_of_it(cluster_url: str) -> None:
    """Paused here, a job is out of this instance's set: an instance that has
    heard of a resume made elsewhere (its heartbeat is a minute away here) has
    another set, and claims the job itself; it loses no tick to an instance
    that still thinks it paused."""
    ran: list[tuple[str, float]] = []
    seen: list[TickSkipped] = []  # b's
    async with engine_for(cluster_url) as engine:
        a = ticking_many(engine, ran, JOBS, [], heartbeat=60)
        b = ticking_many(engine, ran, JOBS, seen, heartbeat=60)
        async with a.running({"db": engine}), b.running({"db": engine}):
            await a.pause(JOBS[3])
            await b.resume(JOBS[3])  # a hears of it in a minute
            resumed = time.time()
            await anyio.sleep(1.5)
    assert a.job_status(JOBS[3]).paused and not b.job_status(JOBS[3]).paused
    # A tick b said it skipped (its store busy, itself late: a slow machine) is
    # not lost to the sets; "claimed elsewhere" would be (a does not claim it),
    # and "paused" after the resume a resume not heard of.
    said = {
        round(event.tick + k * INTERVAL, 3)
        for event in seen
        if event.job == JOBS[3] and event.tick is not None
        if event.reason not in ("claimed_elsewhere", "paused")
        for k in range(event.ticks)
    }
    after = sorted({tick for name, tick in ran if tick > resumed + INTERVAL})[:-1]
    ran_here = {round(tick, 3) for name, tick in ran if name == JOBS[3]}
    lost = [tick for tick in after if round(tick, 3) not in ran_here | said]
    assert not lost, (lost, sorted(ran_here), seen)
    assert ran_here.intersection(round(t, 3) for t in after), (sorted(ran_here), seen)


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_a_kept_connection_closed_by_the_server_costs_no_tick(
    postgres: PostgresServer, driver: str
) -> None:
    """The database ended the store's kept connection (a restart, a failover, a
    DBA): the next claim takes another one, as the pool's own pre-ping would.
    asyncpg knows at once; psycopg learns by a ping, with pool_pre_ping=True."""
    url = postgres.url(postgres.create_database(), driver=driver)
    engine = create_async_engine(url, pool_pre_ping=driver == "psycopg")
    other = create_async_engine(url)
    try:
        async with open_store(engine) as store:
            assert await store.claim([("digest", 1.0)]) == {"digest": 1}
            assert store._operations._kept is not None
            async with other.connect() as conn:
                ended = await conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
                assert ended.all()
            await anyio.sleep(0.3)
            await release_all(store, {"digest": 1})
            assert await store.claim([("digest", 2.0)]) == {"digest": 2}
    finally:
        await other.dispose()
        await engine.dispose()


async def test_an_instants_table_made_wrong_is_not_used(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``create_tables=False`` and an instants table a migration made without a
    column: claims go on as without the table (it only saves work), and the
    store says why it does not use it."""
    engine = create_async_engine(database_url)
    try:
        name = await instants_replaced(engine, made_as="key VARCHAR(64) PRIMARY KEY")
        with caplog.at_level(logging.WARNING, logger="fastapi_jobs.stores"):
            await claims_as_before(engine)
    finally:
        await engine.dispose()
    assert f"table {name} lacks column(s) instant, owner, claimed_at" in caplog.text


async def test_a_release_landed_after_a_peer_claimed_the_instant_costs_no_tick(
    database_url: str,
) -> None:
    """A's run of a job ended just before the next instant; B claimed that
    instant first and found the job still held by A's lease (A's release was on
    its way), so B skipped it; the release then landed, before A claimed. A
    loses the instant, but claims that job on its own: the tick runs on A,
    where it would otherwise have run nowhere (seen once in CI, on SQLite)."""
    engine = create_async_engine(database_url)
    log = logging.getLogger("tests.instant_claims")
    now = time.time()
    due = now - 0.1  # the instant; the run before it was at due - 1
    try:
        async with open_store(engine) as a_store, open_store(engine) as b_store:
            a, b = Claims(a_store, log), Claims(b_store, log)
            a.heartbeat = beat = Heartbeat(a_store, OffsetClock(SystemClock()), log, lambda _: None)
            assert beat.uncertainty == FUTURE_MARGIN  # not measured yet
            local = beat.clock.local()
            beat.heard(local, local + 0.002, local + 0.004)  # a 4 ms round trip
            assert beat.uncertainty == pytest.approx(
                0.003, abs=1e-6
            )  # half of it, and the ms of resolution
            fence = await claim1(a_store, JOBS[0], due - 1)
            assert fence is not None
            wanted = [(job, due) for job in JOBS]
            instant = b.instant(JOBS, due, JOBS)
            b_got = await b.claim(wanted, instant=instant)
            assert not isinstance(b_got, Exception)
            assert sorted(b_got) == JOBS[1:]  # JOBS[0] held by A's lease
            a.release_soon(Ended(JOBS[0], fence, "ok", None, 0.9))
            await a.flush()  # landed, after B's claim
            a_got = await a.claim(wanted, instant=a.instant(JOBS, due, JOBS))
            assert not isinstance(a_got, Exception)
            assert sorted(a_got) == [JOBS[0]]
    finally:
        await engine.dispose()


class InstantsStore(MemoryStore):
    """A memory store that says it claims instants (its releases are real)."""

    instant_claims = True


class Hand:
    """A clock moved by hand."""

    def __init__(self) -> None:
        self.at = 1_000_000.0

    def now(self) -> float:
        return self.at

    async def sleep_until(self, ts: float) -> None:
        await anyio.lowlevel.checkpoint()


async def test_the_releases_kept_for_the_sets_are_a_minutes_where_no_set_is_claimed() -> None:
    """An app with too few jobs due together for a set releases every second
    and never claims an instant, which is where the landed releases were
    pruned: they grew by one a run (86,400 a day for a job of every second).
    Pruned as they land too, a minute's are kept."""
    store, clock = InstantsStore(), Hand()
    log = logging.getLogger("tests.instant_claims")
    claims = Claims(store, log)
    claims.heartbeat = Heartbeat(store, OffsetClock(clock), log, lambda _: None)
    await store.open({}, Instance())
    for _ in range(150):
        clock.at += 1.0
        claims.release_soon(Ended("every_second", 1, "ok", None, 0.01))
        await claims.flush()
    assert 55 <= len(claims._landed) <= LANDED_FOR + 1


class Slowed(SQLAlchemyStore):
    """A store whose claims reach the database late: those of a job alone (no
    instant) by ``alone`` seconds, those of an instant's set by ``instants``."""

    def __init__(self, *args: Any, alone: float = 0.0, instants: float = 0.0) -> None:
        super().__init__(*args)
        self.alone, self.instants = alone, instants

    def _delay(self, given: Mapping[str, Any]) -> float:
        return self.instants if given.get("instant") is not None else self.alone

    async def claim(self, wanted: Sequence[tuple[str, float]], **given: Any) -> Any:
        await anyio.sleep(self._delay(given))
        return await super().claim(wanted, **given)

    async def release_then_claim(
        self, ended: Sequence[Ended], wanted: Sequence[tuple[str, float]], **given: Any
    ) -> tuple[dict[str, Exception], dict[str, int | Exception]]:
        await anyio.sleep(self._delay(given))
        return await super().release_then_claim(ended, wanted, **given)


def noting(
    ran: list[tuple[str, float, str]], me: str, by_hand: list[tuple[float, float]] | None = None
) -> Callable[[JobContext], Any]:
    """A job that notes its name, its tick and the instance it ran on (``me``);
    run by hand, it takes 1.5 s, and notes when it began and ended in ``by_hand``
    (the host's clock, the database's here)."""

    async def job(ctx: JobContext) -> None:
        if ctx.manual and by_hand is not None:
            began = time.time()
            await anyio.sleep(1.5)
            by_hand.append((began, time.time()))
            return
        ran.append((ctx.name, ctx.tick.timestamp(), me))

    return job


def two_instances(
    ran: list[tuple[str, float, str]],
    seen: list[TickSkipped],
    a_alone: float,
    every: float,
    by_hand: list[tuple[float, float]] | None = None,
) -> tuple[Scheduler, Scheduler]:
    """A, whose claims of a job alone reach the database ``a_alone`` s late, and
    B, whose claims of a set come 0.1 s late (so A wins the instants): each with
    ``JOBS[0]`` every ``every`` s and the others every 0.6 s."""
    instances = []
    for me, options in (("A", {"alone": a_alone}), ("B", {"instants": 0.1})):
        scheduler = Scheduler(
            store=Slowed(lambda state: state["db"], **options), shutdown_timeout=5
        )
        scheduler.add_observer(Seeing(seen))
        job = noting(ran, me, by_hand)
        scheduler.add_job(job, Every(seconds=every), name=JOBS[0])
        for name in JOBS[1:]:
            scheduler.add_job(job, Every(seconds=0.6), name=name)
        instances.append(scheduler)
    a, b = instances
    return a, b


def heard_by(
    scheduler: Scheduler, ran: list[tuple[str, float, str]], seen: list[TickSkipped], tick: float
) -> bool:
    """B (``scheduler``) ran ``tick`` of ``JOBS[0]``, or said it did not."""
    ticks: list[float | None] = [t for name, t, by in ran if name == JOBS[0] and by == "B"]
    ticks += [e.tick for e in seen if e.instance == scheduler.instance.id and e.job == JOBS[0]]
    return any(t is not None and abs(tick - t) < 1e-3 for t in ticks)


def overlaps(scheduler: Scheduler, seen: list[TickSkipped]) -> set[float]:
    """The ticks of ``JOBS[0]`` that ``scheduler`` skipped as overlap."""
    return {
        e.tick
        for e in seen
        if e.instance == scheduler.instance.id
        and e.job == JOBS[0]
        and e.reason == "overlap"
        and e.tick is not None
    }


def assert_run_by_b(
    a: Scheduler,
    b: Scheduler,
    ran: list[tuple[str, float, str]],
    seen: list[TickSkipped],
    skipped: set[float],
    held: set[float] = frozenset(),  # type: ignore[assignment]
) -> None:
    """Each of ``skipped`` (ticks of ``JOBS[0]`` A skipped) ran on B, or B had a
    reason of its own not to run it: it woke late, or could not reach the store
    (a loaded machine); or it is one of ``held``, ticks A's own claim held."""
    on_b = {tick for name, tick, by in ran if name == JOBS[0] and by == "B"}
    excused = {
        e.tick
        for e in seen
        if e.instance == b.instance.id
        and e.job == JOBS[0]
        and e.reason in ("missed", "store_unavailable")
        and e.tick is not None
    }
    lost = sorted(
        tick for tick in skipped if not any(abs(tick - t) < 1e-3 for t in on_b | excused | held)
    )
    told = [
        f"{'A' if e.instance == a.instance.id else 'B'} {e.tick} {e.reason}"
        for e in seen
        if e.job == JOBS[0]
    ]
    runs = [f"{by} {tick}" for name, tick, by in ran if name == JOBS[0]]
    assert not lost, f"{lost}\nskipped: {told}\nran: {runs}"
    assert max(Counter((name, tick) for name, tick, _ in ran).values()) == 1


async def test_a_job_whose_last_claim_is_on_its_way_is_claimed_by_the_peers(
    cluster_url: str,
) -> None:
    """``JOBS[0]`` comes due every 0.3 s, the others every 0.6 s: at every other
    instant it is claimed alone, and A's claims of it alone reach the database
    0.4 s late, past the next instant, where it is due with the set. A, its
    claim of the tick before unanswered, skips that one; B's claims of the set
    come 0.1 s late, so A wins the instant. A counted the job in its set all
    the same, sent no claim for it, and B, losing the instant, skipped it too:
    the tick ran nowhere (seen in CI under load, a claim slowed by SQLite's
    lock). Now the job is out of A's set: B claims it."""
    ran: list[tuple[str, float, str]] = []  # job, tick, instance
    seen: list[TickSkipped] = []
    async with engine_for(cluster_url) as engine:
        a, b = two_instances(ran, seen, a_alone=0.4, every=0.3)

        def skipped_by_a() -> set[float]:
            """The set's instants at which A skipped the job, its claim on its way."""
            return {t for t in overlaps(a, seen) if round(t / 0.3) % 2 == 0}

        async with a.running({"db": engine}), b.running({"db": engine}):
            await poll(lambda: len(skipped_by_a()) >= 4, within=30)
            skipped = skipped_by_a()
            # B claims 0.1 s after A: the last of them may be on its way.
            await poll(lambda: all(heard_by(b, ran, seen, t) for t in skipped), within=30)
    # A tick A ran itself (its first, before B started) holds the job as B's
    # late claim of the next lands: dropped, rightly.
    held = {t + 0.3 for name, t, by in ran if name == JOBS[0] and by == "A"}
    assert_run_by_b(a, b, ran, seen, skipped, held)


async def test_a_run_by_hand_leaves_the_jobs_ticks_to_the_peers(cluster_url: str) -> None:
    """A runs ``JOBS[0]`` by hand for 1.5 s (``run_now``, which claims nothing)
    while both instances tick every 0.6 s, and A wins the instants (B's claims
    of the set come 0.1 s late). A skips the job's ticks meanwhile; B runs them.
    Before, A kept the job in its set, claimed nothing for it, and B, losing
    the instant, skipped it: the cluster ran none of them (the review's
    finding)."""
    ran: list[tuple[str, float, str]] = []
    seen: list[TickSkipped] = []
    by_hand: list[tuple[float, float]] = []
    async with engine_for(cluster_url) as engine:
        a, b = two_instances(ran, seen, a_alone=0.0, every=0.6, by_hand=by_hand)
        async with a.running({"db": engine}), b.running({"db": engine}):
            # Both going: B has lost an instant to A.
            await poll(
                lambda: any(
                    e.instance == b.instance.id and e.reason == "claimed_elsewhere" for e in seen
                ),
                within=30,
            )
            result = await a.run_now(JOBS[0])
            assert result.outcome == "ok", result
            ((began, ended),) = by_hand
            skipped = {t for t in overlaps(a, seen) if began < t < ended}
            assert skipped, seen  # 1.5 s of a 0.6 s job
            await poll(lambda: all(heard_by(b, ran, seen, t) for t in skipped), within=30)
    assert_run_by_b(a, b, ran, seen, skipped)
