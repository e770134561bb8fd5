"""The database's clock as the scheduler follows it: the offset estimate from
each heartbeat, and a slow first beat that must not make the first ticks early."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fastapi_jobs._core.heartbeat import OffsetEstimate
from fastapi_jobs.stores import SQLAlchemyStore

from ..support.instances import engine_for, first_runs


def test_the_clock_offset_keeps_to_the_quickest_recent_beat() -> None:
    """Each beat bounds the database's offset by its round trip; a slow beat whose
    database read its clock late (after a lock wait) does not drag the estimate off,
    a clock stepped by 3 s is followed at once, and so is an hour's drift."""
    estimate = OffsetEstimate()
    assert estimate.add(0.0, 100.0005, 0.001) == pytest.approx(100.0, abs=0.002)
    # 100 ms round trip; the database read its clock 90 ms in (its midpoint: +40 ms).
    assert estimate.add(1.0, 101.09, 1.1) == pytest.approx(100.0, abs=0.002)
    # The local clock stepped back 3 s: the bounds no longer meet.
    assert estimate.add(-1.0, 101.0005, -0.999) == pytest.approx(102.0, abs=0.002)
    # An hour on, the clocks drifted 0.1 s apart (28 ppm): the widened bounds meet it.
    assert estimate.add(3599.0, 3701.1005, 3599.001) == pytest.approx(102.1, abs=0.002)


class SlowFirstBeat(SQLAlchemyStore):
    """A store whose first heartbeat waits 0.3 s before the database reads its
    clock, as a first connection (or a lock) makes it do."""

    slow = True

    async def beat(self) -> float:
        if self.slow:
            self.slow = False
            await anyio.sleep(0.3)
        return await super().beat()


async def test_a_slow_first_beat_does_not_make_the_first_ticks_early(tmp_path: Path) -> None:
    """The first beat's round trip is 0.3 s, all of it before the database read its
    clock: its middle would put the clock 0.15 s ahead until the next beat (a
    minute away). A second beat at start keeps the first ticks on time."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    async with engine_for(url) as engine:
        store = SlowFirstBeat(lambda state: state["db"], heartbeat=60)
        runs, _ = await first_runs(engine, store, 3, 0.1)
    late = [started - tick for tick, started in runs]  # each run's start, after its tick
    assert min(late) > -0.01, late


def test_a_refusal_as_ahead_moves_the_clock_only_by_a_reading_of_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A claim refused as ahead of the database's clock brings the database's
    reading: the instance's offset takes it at once. A store of one's own that
    says NaN or infinity moves nothing (the refusal is still logged)."""
    import logging
    import math

    from fastapi_jobs import TickAheadError
    from fastapi_jobs._clock import OffsetClock
    from fastapi_jobs._core.claims import Claims
    from fastapi_jobs._core.heartbeat import Heartbeat
    from fastapi_jobs.testing import MemoryStore

    store = MemoryStore()
    clock = OffsetClock(StepLocal())
    claims = Claims(store, logging.getLogger("t"))
    claims.heartbeat = Heartbeat(store, clock, logging.getLogger("t"), lambda pauses: None)
    claims.heard(TickAheadError(1030.0, 1000.0), 999.9, ["job"])  # local 1000.0 at the answer
    assert clock.offset == pytest.approx(0.05, abs=0.06)
    for nonsense in (math.nan, math.inf, -math.inf):
        claims.heard(TickAheadError(1030.0, nonsense), 999.9, ["job"])
        assert math.isfinite(clock.offset) and abs(clock.offset) < 0.2
    assert sum("ahead of its clock" in r.getMessage() for r in caplog.records) == 4


def test_a_refusal_within_the_claims_margin_moves_nothing_and_says_how_far_ahead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refusal whose tick is not ahead of the database's reading by more than
    the claim's margin (1 s) disagrees with itself: the clock stays. The warning
    names the jobs and says how far ahead their tick was."""
    import logging

    from fastapi_jobs import TickAheadError
    from fastapi_jobs._clock import OffsetClock
    from fastapi_jobs._core.claims import Claims
    from fastapi_jobs._core.heartbeat import Heartbeat
    from fastapi_jobs.testing import MemoryStore

    store = MemoryStore()
    clock = OffsetClock(StepLocal())
    claims = Claims(store, logging.getLogger("t"))
    claims.heartbeat = Heartbeat(store, clock, logging.getLogger("t"), lambda pauses: None)
    for tick in (1000.5, 1001.0):
        claims.heard(TickAheadError(tick, 1000.0), 999.9, ["a", "b"])
        assert clock.offset == 0.0
    assert [r.getMessage() for r in caplog.records][-1] == (
        "the database refused the claims of 'a', 'b': their tick is 1.0s ahead of its "
        "clock (stepped back?); ticking on the database's time"
    )


class StepLocal:
    """A local clock that reads 1000.0."""

    def now(self) -> float:
        return 1000.0

    async def sleep_until(self, ts: float) -> None:  # pragma: no cover - never slept on
        raise AssertionError
