"""What tests of an app's jobs use: a clock that virtual time can drive, and a
store in memory on that clock.

With `looptime` (or any fast-forwarded event loop) the loop's clock runs ahead
while ``time.time()`` does not; ``LoopClock`` reads the loop's::

    from fastapi_jobs.testing import LoopClock

    scheduler = Scheduler(clock=LoopClock(start=datetime(2026, 3, 2, tzinfo=UTC)))

With a store, give the scheduler a ``MemoryStore``: it reads the scheduler's
clock, so its claims, leases and pauses keep to virtual time too, and
schedulers on one ``MemoryDatabase`` are instances of one app.

``scheduler.run_now(name)`` runs one job on demand (see the docs' "Testing
your jobs").
"""

from __future__ import annotations

from ._clock import LoopClock
from .stores._memory import MemoryDatabase, MemoryStore

__all__ = ["LoopClock", "MemoryDatabase", "MemoryStore"]

for _kind in (LoopClock, MemoryDatabase, MemoryStore):
    _kind.__module__ = __name__
del _kind
