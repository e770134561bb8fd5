"""What tests of an app's jobs use: a clock that virtual time can drive.

With `looptime` (or any fast-forwarded event loop) the loop's clock runs ahead
while ``time.time()`` does not; ``LoopClock`` reads the loop's::

    from fastapi_jobs.testing import LoopClock

    scheduler = Scheduler(clock=LoopClock(start=datetime(2026, 3, 2, tzinfo=UTC)))

``scheduler.run_now(name)`` runs one job on demand (see the docs' "Testing
your jobs").
"""

from __future__ import annotations

from ._clock import LoopClock

__all__ = ["LoopClock"]

LoopClock.__module__ = __name__
