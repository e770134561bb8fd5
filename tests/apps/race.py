"""A race worker: claims tick 1..N of one job, in lockstep with its rivals."""

from __future__ import annotations

import json
from multiprocessing.synchronize import Barrier

import anyio
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs.stores import Ended, Instance, SQLAlchemyStore


def race(url: str, rounds: int, barrier: Barrier, out: str) -> None:
    anyio.run(_race, url, rounds, barrier, out)


async def _race(url: str, rounds: int, barrier: Barrier, out: str) -> None:
    engine = create_async_engine(url)
    store = SQLAlchemyStore(engine, timeout=5, lease=30)
    await store.open({}, Instance())
    won: list[tuple[int, int]] = []
    await store.last_tick("race")  # all 8 create the tables at once: a race of its own
    for tick in range(1, rounds + 1):
        await anyio.to_thread.run_sync(barrier.wait, 60)
        fence = (await store.claim([("race", float(tick))])).get("race")
        assert not isinstance(fence, Exception), fence
        if fence is not None:
            won.append((tick, fence))
            await store.release([Ended("race", fence, "ok", None, 0.0)])
        # Nobody starts the next round before the winner has released.
        await anyio.to_thread.run_sync(barrier.wait, 60)
    await store.close()
    await engine.dispose()
    await anyio.Path(out).write_text(json.dumps(won))
