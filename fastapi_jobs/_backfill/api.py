"""The scheduler's method for backfills: the signature and docstring users see,
handing the call to the backfills (``_backfill.runs``).

``Scheduler`` takes it from `BackfillMethods` (one concern, one module), as
it takes its other sides' work from theirs."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from .results import BackfillResult
from .runs import MAX_TICKS, Progress, backfills

if TYPE_CHECKING:
    from .._core.seam import Seam

__all__ = ["BackfillMethods"]


class BackfillMethods:
    """`Scheduler`'s part for backfills."""

    _seam: Seam

    async def backfill(
        self,
        name: str,
        since: datetime,
        until: datetime,
        *,
        max_ticks: int = MAX_TICKS,
        progress: Progress | None = None,
    ) -> BackfillResult:
        """Run job ``name`` once for every tick of its schedule from ``since`` to
        ``until`` (aware datetimes, both included, in the past), oldest first,
        one at a time, in the running scheduler; return how each tick went.

        Each run is the job's task's, as a trigger's is (``ctx.manual`` is
        True, ``ctx.tick`` the backfilled tick): a live tick that comes during
        it meets a run going (by default dropped as ``overlap``), and a live
        run going is waited for before the next tick. With a store each tick
        is claimed first: one that ran already (on any instance, as the
        store's history says) is skipped, a lease held elsewhere is waited for
        up to the store's lease, and two backfills of one range run each tick
        once. Without one, nothing is shared between processes.

        ``progress(number, count, tick)`` is told after each tick. Raises
        `ConfigurationError` for a range without a time zone, reversed, in
        the future or with more than ``max_ticks`` ticks, `JobNotFoundError`,
        `NotRunningError`, and `JobRunningError` while a backfill of the job
        goes.
        """
        engine = backfills(self._seam)
        return await engine.run(name, since, until, max_ticks, progress)
