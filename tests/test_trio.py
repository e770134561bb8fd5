"""The scheduler runs on trio too (anyio's other backend): its loops are then
anyio tasks, each in its own cancel scope."""

from __future__ import annotations

import anyio

from fastapi_jobs import JobContext, Scheduler


def test_jobs_tick_and_stop_on_trio() -> None:
    """On trio: jobs run on their grid, a failing one hurts no other, shutdown drains."""
    scheduler = Scheduler(shutdown_timeout=5)
    ticks: list[float] = []
    finished: list[str] = []

    @scheduler.every(seconds=0.05)
    async def fast(ctx: JobContext) -> None:
        ticks.append(ctx.tick.timestamp())

    @scheduler.every(seconds=0.05)
    async def broken() -> None:
        raise ValueError("nope")

    @scheduler.every(seconds=0.05)
    async def slow() -> None:
        await anyio.sleep(0.2)
        finished.append("slow")

    @scheduler.every(hours=1)
    async def idle() -> None:
        pass

    async def main() -> None:
        async with scheduler.running():
            await anyio.sleep(0.33)

    anyio.run(main, backend="trio")
    assert len(ticks) >= 4
    assert all(abs(t * 20 - round(t * 20)) < 1e-6 for t in ticks)  # on the 50 ms grid
    assert scheduler.job_status("broken").failures >= 4
    assert scheduler.job_status("slow").last_outcome == "ok"  # drained, not cut
    assert scheduler.job_status("idle").runs == 0
