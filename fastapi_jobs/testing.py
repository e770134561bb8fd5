"""What tests of an app's jobs use: a clock that virtual time can drive, and a
store in memory on that clock.

With `looptime` (or any fast-forwarded event loop) the loop's clock runs ahead
while ``time.time()`` does not; ``LoopClock`` reads the loop's::

    from fastapi_jobs.testing import LoopClock

    scheduler = Scheduler(clock=LoopClock(start=datetime(2026, 3, 2, tzinfo=UTC)))

With a store, give the scheduler a ``MemoryStore``: it reads the scheduler's
clock, so its claims, leases and pauses keep to virtual time too, and
schedulers on one ``MemoryDatabase`` are instances of one app.

To run the app your code builds (a module-level scheduler with its jobs
declared, and a store of the app's database) in virtual time, enter
``virtual(scheduler, start)``: it gives that very scheduler a ``LoopClock`` and
a ``MemoryStore`` for the block.

``scheduler.run_now(name)`` runs one job on demand (see the docs' "Testing
your jobs").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from ._clock import LoopClock
from ._errors import ConfigurationError, short
from ._scheduler import Scheduler, seam_of
from .stores._memory import MemoryDatabase, MemoryStore

__all__ = ["LoopClock", "MemoryDatabase", "MemoryStore", "virtual"]


@contextmanager
def virtual(
    scheduler: Scheduler, start: datetime, *, database: MemoryDatabase | None = None
) -> Iterator[LoopClock]:
    """Run the app's own ``scheduler`` in virtual time for the ``with`` block:
    on a `LoopClock` from ``start`` (which it yields), and, if it has a store,
    on a `MemoryStore` with the same lease, timeout and heartbeat, on
    ``database`` (a new one by default: the real store is never opened).
    Its jobs, tasks and observers stay as declared, so a test runs the very
    app your code builds; each block starts them afresh (no runs, no counts,
    no pauses but declared ones). Enter it before the app starts (a sync
    fixture will do); after the block the scheduler has its own clock and
    store back.

    ```python
    # fragment: a fixture of your tests; `scheduler` is your app's
    @pytest.fixture
    def clock() -> Iterator[LoopClock]:
        with virtual(scheduler, datetime(2026, 3, 2, tzinfo=UTC)) as clock:
            yield clock
    ```
    """
    if not isinstance(scheduler, Scheduler):
        raise ConfigurationError(f"virtual({short(scheduler)}): pass the app's Scheduler")
    if not isinstance(start, datetime) or start.tzinfo is None:
        raise ConfigurationError(
            f"virtual(start={short(start)}): give an aware datetime, e.g. "
            "datetime(2026, 3, 2, tzinfo=UTC)"
        )
    clock = LoopClock(start)
    own_clock, own_store = scheduler.clock, scheduler.store
    store = None
    if own_store is not None:
        store = MemoryStore(
            database or MemoryDatabase(clock),
            lease=own_store.lease,
            timeout=own_store.timeout,
            heartbeat=own_store.heartbeat,
        )
    seam = seam_of(scheduler)
    seam.connect(clock, store)
    try:
        yield clock
    finally:
        seam.connect(own_clock, own_store)


for _kind in (LoopClock, MemoryDatabase, MemoryStore):  # (virtual is a function)
    _kind.__module__ = __name__
del _kind
