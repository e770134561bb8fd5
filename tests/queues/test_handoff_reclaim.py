"""A hand-off tick whose claimer died is claimed again, once, after its lease.

Store level: the re-claim statement on real databases (SQLite files, PostgreSQL
through asyncpg and psycopg); short leases on the database's clock, wide
margins, polls. Scheduler level: the remembering of ticks claimed elsewhere
(virtual time, a real SQLite store), and three real uvicorn instances on
PostgreSQL handing off to a real arq worker, one of them SIGKILLed between its
claim and its enqueue, or between its enqueue and its release.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from arq import create_pool
from arq.connections import RedisSettings
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fastapi_jobs import Scheduler
from fastapi_jobs.queues import HandoffRequest, handoff_key
from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import claim1, open_store, release1
from ..support.cluster import ROOT, App, rows
from ..support.instances import engine_for, instance
from ..support.postgres import PostgresServer
from ..support.redis import RedisServer
from ..support.ticks import (
    after_a_dead_claimer,
    dropped_while_held,
    refused_after_a_dead_claimer,
)
from ..support.waiting import poll
from ..support.workers import stop
from .test_handoff_arq import start_worker

# Short enough to wait out, long enough that a paused test process (a garbage
# collection, tests.pauses' 0.3 s) does not see a lease run out it was to see held.
LEASE = 1.5
TIMEOUT = 0.45


@asynccontextmanager
async def two_stores(
    url: str,
) -> AsyncIterator[tuple[SQLAlchemyStore, SQLAlchemyStore, AsyncEngine]]:
    """A claimer and a peer on one database, sharing nothing but the database."""
    engine: AsyncEngine = create_async_engine(url)
    try:
        async with (
            open_store(engine, lease=LEASE, timeout=TIMEOUT) as claimer,
            open_store(engine, lease=LEASE, timeout=TIMEOUT) as peer,
        ):
            yield claimer, peer, engine
    finally:
        await engine.dispose()


async def _wait_lease_over(peer: SQLAlchemyStore, job: str, tick: float) -> None:
    """Until the lease of ``job``'s claim of ``tick`` is over on the database's
    clock, read through the peer's re-claim of an older tick (which never wins)."""

    async def over() -> bool:
        answer = (await peer.reclaim([(job, tick - 1.0)])).get(job)
        assert isinstance(answer, tuple), answer
        held_tick, left = answer
        assert held_tick == tick
        return left < 0

    await poll(over, within=10)


async def test_an_abandoned_claim_is_claimed_again_once_after_its_lease(
    database_url: str,
) -> None:
    """A tick claimed and never released is claimed again by a peer once its
    lease is over, with a grown fence, and only once."""
    async with two_stores(database_url) as (claimer, peer, _):
        assert await claim1(claimer, "digest", 100.0) == 1  # then the claimer "dies"
        early = (await peer.reclaim([("digest", 100.0)]))["digest"]
        assert isinstance(early, tuple) and early[0] == 100.0 and early[1] > 0  # still leased
        await _wait_lease_over(peer, "digest", 100.0)
        assert await peer.reclaim([("digest", 100.0)]) == {"digest": 2}
        again = (await peer.reclaim([("digest", 100.0)]))["digest"]
        assert isinstance(again, tuple) and again[0] == 100.0 and again[1] > 0  # ours now
        assert not await claimer.renew("digest", 1)  # the dead claimer's fence is stale
        await release1(peer, "digest", 2, "ok", None, 0.1)
        view = await peer.read()
        assert view.jobs["digest"].fence == 2
        assert view.jobs["digest"].last_tick.timestamp() == 100.0  # type: ignore[union-attr]
        [run] = await peer.runs("digest", 10)
        assert run.tick is not None and run.tick.timestamp() == 100.0
        assert run.fence == 2 and run.outcome == "ok"


async def test_a_released_claim_is_not_claimed_again(database_url: str) -> None:
    """A tick whose run was released (ran, or freed) is never claimed again."""
    async with two_stores(database_url) as (claimer, peer, _):
        assert await claim1(claimer, "digest", 100.0) == 1
        await release1(claimer, "digest", 1, "ok", None, 0.1)
        assert await peer.reclaim([("digest", 100.0)]) == {}  # released: nothing held
        assert await peer.reclaim([("other", 100.0)]) == {}  # no row at all


async def test_a_claim_whose_lease_is_renewed_is_not_claimed_again(database_url: str) -> None:
    """A claimer that is alive and renews keeps its tick: the re-claim answers
    with the tick held and the time left on its lease."""
    async with two_stores(database_url) as (claimer, peer, _):
        assert await claim1(claimer, "digest", 100.0) == 1
        answer = (await peer.reclaim([("digest", 100.0)]))["digest"]
        assert isinstance(answer, tuple)
        tick, left = answer
        assert tick == 100.0 and 0 < left <= LEASE
        assert await claimer.renew("digest", 1)
        assert await claimer.renew("digest", 1)


async def test_a_row_whose_tick_moved_on_is_not_claimed_again(database_url: str) -> None:
    """Once a newer tick is claimed, the older one is never claimed again, even
    when the newer claim is itself abandoned (the answer names the tick held)."""
    async with two_stores(database_url) as (claimer, peer, _):
        assert await claim1(claimer, "digest", 100.0) == 1
        await release1(claimer, "digest", 1, "ok", None, 0.1)
        assert await claim1(claimer, "digest", 200.0) == 2  # then the claimer "dies"
        await _wait_lease_over(peer, "digest", 200.0)
        answer = (await peer.reclaim([("digest", 100.0)]))["digest"]
        assert isinstance(answer, tuple) and answer[0] == 200.0 and answer[1] < 0
        assert await peer.reclaim([("digest", 200.0)]) == {"digest": 3}


async def test_a_claim_of_a_later_tick_never_takes_an_abandoned_hand_off_row(
    database_url: str,
) -> None:
    """A hand-off claim of a later tick, sent once the abandoned claim's lease is
    over (as a peer's is when the lease is a whole number of intervals), is
    refused: the row stays on the abandoned tick, which only a re-claim takes.
    A job that hands nothing off takes the row as before."""
    async with two_stores(database_url) as (claimer, peer, _):
        # Then the claimer "dies"; "plain" is an in-process job's claim.
        both = await claimer.claim([("digest", 100.0), ("plain", 100.0)])
        assert both == {"digest": 1, "plain": 1}  # one statement: one lease for both
        await _wait_lease_over(peer, "digest", 100.0)
        later = await peer.claim([("digest", 101.0), ("plain", 101.0)], handoffs=["digest"])
        assert later == {"plain": 2}
        [(held, left)] = (await peer.reclaim([("digest", 101.0)])).values()  # type: ignore[misc]
        assert held == 100.0 and left < 0  # the answer points the re-claim at it
        assert await peer.reclaim([("digest", 100.0)]) == {"digest": 2}
        await release1(peer, "digest", 2, "ok", None, 0.1)
        assert await peer.claim([("digest", 101.0)], handoffs=["digest"]) == {"digest": 3}


async def test_a_paused_job_is_not_claimed_again(database_url: str) -> None:
    """A pause holds for re-claims as for claims."""
    async with two_stores(database_url) as (claimer, peer, _):
        assert await claim1(claimer, "digest", 100.0) == 1
        await peer.pause("digest", None)
        await _wait_lease_over(peer, "digest", 100.0)
        answer = (await peer.reclaim([("digest", 100.0)]))["digest"]
        assert isinstance(answer, tuple) and answer[1] < 0
        await peer.resume("digest")
        assert await peer.reclaim([("digest", 100.0)]) == {"digest": 2}


async def test_of_two_concurrent_reclaims_one_wins(database_url: str) -> None:
    """Two peers re-claim one abandoned tick at once: exactly one gets it."""
    async with two_stores(database_url) as (claimer, peer, engine):
        assert await claim1(claimer, "digest", 100.0) == 1
        async with open_store(engine, lease=LEASE, timeout=TIMEOUT) as third:
            await _wait_lease_over(peer, "digest", 100.0)
            answers = await asyncio.gather(
                peer.reclaim([("digest", 100.0)]), third.reclaim([("digest", 100.0)])
            )
    won = [answer["digest"] for answer in answers if isinstance(answer.get("digest"), int)]
    assert won == [2], answers


class Recording:
    """A hand-off of the test's own: the keys it enqueued, in order (shared by
    the instances of a test, like a queue), each after ``slow`` seconds if it is
    the first enqueue of this hand-off."""

    name = "recording"

    def __init__(self, queue: list[str], slow: float = 0.0) -> None:
        self.queue = queue
        self.slow = slow
        self.mine: list[str] = []

    async def enqueue(self, request: HandoffRequest) -> str:
        key = request.key
        first = not self.mine
        self.mine.append(key)
        if first and self.slow:
            await anyio.sleep(self.slow)
        self.queue.append(key)
        return key


def _handing_off(engine: AsyncEngine, handoff: Recording) -> Scheduler:
    scheduler = instance(engine, lease=LEASE, timeout=TIMEOUT)

    @scheduler.every(seconds=1, enqueue=handoff)
    async def digest() -> None:
        return None

    return scheduler


async def test_a_tick_whose_claimer_died_is_handed_off_by_a_peer_after_its_lease(
    tmp_path: Path,
) -> None:
    """A claimer that claimed a tick and died (a store that claims and never
    releases): the running instance claims the tick again after its lease and
    hands it off under its own key, once, recorded as a run of that tick."""
    queue: list[str] = []
    async with engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine:
        peer = _handing_off(engine, Recording(queue))
        async with open_store(engine, lease=LEASE, timeout=TIMEOUT) as dead:
            async with peer.running({"db": engine}):
                tick = math.floor(time.time()) + 2.0
                await anyio.sleep(tick - 0.3 - time.time())
                assert await claim1(dead, "digest", tick) is not None  # and never released
                key = handoff_key("digest", datetime.fromtimestamp(tick, UTC))
                await poll(lambda: key in queue, within=15)
                await poll(lambda: len(queue) >= queue.index(key) + 3, within=15)
            runs = {r.tick.timestamp(): r for r in await dead.runs("digest", 100) if r.tick}
    assert queue.count(key) == 1
    assert len(queue) == len(set(queue)), queue
    assert runs[tick].outcome == "ok" and runs[tick].instance == peer.instance.id


async def test_an_instance_alone_restarted_hands_off_the_tick_it_died_holding(
    tmp_path: Path,
) -> None:
    """The only instance claimed a tick and died before enqueuing it; restarted
    once its lease is over, its first claim is refused (the row still holds
    that tick), and it claims the abandoned tick again and hands it off, once,
    before any later tick."""
    queue: list[str] = []
    async with (
        engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine,
        open_store(engine, lease=LEASE, timeout=TIMEOUT) as dead,
    ):
        tick = float(math.floor(time.time()))
        assert await claim1(dead, "digest", tick) is not None  # and never released
        await _wait_lease_over(dead, "digest", tick)
        restarted = _handing_off(engine, Recording(queue))
        async with restarted.running({"db": engine}):
            key = handoff_key("digest", datetime.fromtimestamp(tick, UTC))
            await poll(lambda: key in queue, within=15)
            await poll(lambda: len(queue) >= queue.index(key) + 2, within=15)
        runs = {r.tick.timestamp(): r for r in await dead.runs("digest", 100) if r.tick}
    assert queue[0] == key, queue  # no later tick went before it
    assert queue.count(key) == 1 and len(queue) == len(set(queue)), queue
    assert runs[tick].outcome == "ok" and runs[tick].instance == restarted.instance.id


async def test_a_holder_that_renews_keeps_its_tick_and_the_peer_forgets_it(
    tmp_path: Path,
) -> None:
    """The claimer of a tick is alive and its enqueue outlasts the lease (it
    renews): its peer asks again while the row is leased, never takes the tick,
    forgets it once released; every tick is handed off once."""
    queue: list[str] = []
    slow, fast = Recording(queue, slow=2.5 * LEASE), Recording(queue)
    async with engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine:
        holder, peer = _handing_off(engine, slow), _handing_off(engine, fast)
        async with holder.running({"db": engine}):
            await poll(lambda: bool(slow.mine), within=15)  # its first enqueue has begun
            first = slow.mine[0]
            async with peer.running({"db": engine}):
                await poll(lambda: first in queue, within=15)
                await poll(lambda: len(queue) >= queue.index(first) + 3, within=15)
    assert first not in fast.mine
    assert len(queue) == len(set(queue)), queue


def _handoff_cluster(
    url: str,
    redis: RedisServer,
    queue: str,
    block: Path,
    at: str,
    apps: list[App],
    timing: tuple[float, float] = (3, 2),
) -> list[App]:
    """Three uvicorn instances of tests/apps/handoff_app.py (``timing``: the
    interval and the lease, in seconds)."""
    interval, lease = timing
    env: dict[str, object] = {
        "FJ_REDIS_SOCKET": str(redis.socket),
        "FJ_QUEUE": queue,
        "INTERVAL": interval,
        "LEASE": lease,
        "TIMEOUT": "0.6",
        "BLOCK": str(block),
        "BLOCK_AT": at,
    }
    for _ in range(3):
        apps.append(App(url, app="tests.apps.handoff_app:app", **env))  # type: ignore[arg-type]
    for app in apps:
        app.wait_started()
    return apps


async def _executions(redis: RedisServer, queue: str) -> list[dict[str, Any]]:
    pool = await create_pool(RedisSettings(unix_socket_path=str(redis.socket), conn_retries=0))
    try:
        raw = await pool.lrange(f"executions:{queue}", 0, -1)  # type: ignore[misc]
        return [json.loads(entry) for entry in raw]
    finally:
        await pool.aclose()


# (interval, lease) in seconds: a lease shorter than the interval; a lease of a
# whole number of intervals (a claim of the next tick comes as the lease ends,
# and must not take the abandoned tick's row); the default lease (30 s).
TIMINGS = [
    pytest.param("before", (3, 2), id="before-3s/2s"),
    pytest.param("after", (3, 2), id="after-3s/2s"),
    pytest.param("before", (1, 3), id="before-1s/3s"),
    pytest.param("after", (1, 3), id="after-1s/3s"),
    pytest.param("before", (10, 30), id="before-10s/30s"),
]


@pytest.mark.parametrize(("at", "timing"), TIMINGS)
@pytest.mark.slow  # minutes of real processes: CI's second run (pytest -m slow)
async def test_a_claimer_killed_around_its_enqueue_leaves_each_tick_executed_once(
    at: str,
    timing: tuple[float, float],
    postgres: PostgresServer,
    redis: RedisServer,
    tmp_path: Path,
    apps: list[App],
) -> None:
    """Three instances hand one job off to a real arq worker; the instance that
    won a chosen tick is SIGKILLed before its enqueue (``before``) or after it,
    before its release (``after``). A peer claims the tick again after its lease
    and enqueues it under the same key (``after``: arq refuses it as a
    duplicate, and the run is ok): the worker executes every tick of the
    window exactly once, the chosen one included, whatever the interval and
    the lease."""
    interval, lease = timing
    url = postgres.url(postgres.create_database())
    queue = f"fj-reclaim:{uuid.uuid4().hex[:8]}"
    worker = start_worker(
        "tests.apps.arq_worker.WorkerSettings",
        ROOT,
        tmp_path / "arq_worker.log",
        FJ_REDIS_SOCKET=str(redis.socket),
        FJ_QUEUE=queue,
    )
    block = tmp_path / "block"
    try:
        _handoff_cluster(url, redis, queue, block, at, apps, timing)
        await poll(lambda: _count_at_least(redis, queue, 1), within=30)
        block.touch()  # the next tick's winner takes it and blocks
        taken = Path(f"{block}.taken")
        await poll(lambda: taken.exists() and " " in taken.read_text(), within=30)
        pid, key = (await anyio.Path(taken).read_text()).split(" ", 1)
        if at == "after":
            await poll(lambda: Path(f"{block}.enqueued").exists(), within=30)
        [victim] = [app for app in apps if app.pid == int(pid)]
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        chosen = datetime.fromisoformat(key.split("@", 1)[1].replace("Z", "+00:00"))
        # The chosen tick, then two ticks after those a dead claim may cost.
        await poll(lambda: _executed(redis, queue, key), within=lease + 30)
        end = after_a_dead_claimer(chosen.timestamp(), interval, lease)
        await poll(
            lambda: _executed_tick_at_least(redis, queue, end), within=end - time.time() + 30
        )
        for app in apps:
            if app is not victim:
                app.terminate()
        executions = await _executions(redis, queue)
        peers = "".join(app.output() for app in apps if app is not victim)
    finally:
        stop(worker)
    keys = [entry["key"] for entry in executions]
    assert keys.count(key) == 1, keys
    assert len(keys) == len(set(keys)), f"a tick was executed twice: {keys}"
    ticks = sorted(
        datetime.fromisoformat(entry["kwargs"]["tick"]).timestamp() for entry in executions
    )
    window = [t for t in ticks if ticks[0] <= t <= end]
    expected = [ticks[0] + interval * k for k in range(round((end - ticks[0]) / interval) + 1)]
    # The ticks due while the dead claim holds the job may be refused (see
    # docs/guides/queues.md); no other.
    missing = set(expected) - set(window)
    held = dropped_while_held(url, "digest", ticks, interval)
    assert missing <= refused_after_a_dead_claimer(chosen.timestamp(), interval, lease) | held, (
        missing,
        ticks,
    )
    assert "claimed again after its lease" in peers
    [(outcome, by)] = rows(
        url,
        "SELECT outcome, instance FROM fastapi_jobs_runs WHERE job = 'digest' AND tick = :t",
        t=chosen.timestamp(),
    )
    assert outcome == "ok" and by.split(":")[1] != pid  # a peer's run of that tick


async def _count_at_least(redis: RedisServer, queue: str, n: int) -> bool:
    return len(await _executions(redis, queue)) >= n


async def _executed(redis: RedisServer, queue: str, key: str) -> bool:
    return any(entry["key"] == key for entry in await _executions(redis, queue))


async def _executed_tick_at_least(redis: RedisServer, queue: str, tick: float) -> bool:
    return any(
        datetime.fromisoformat(entry["kwargs"]["tick"]).timestamp() >= tick
        for entry in await _executions(redis, queue)
    )
