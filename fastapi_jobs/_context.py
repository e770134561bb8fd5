"""What a job is told about the run it is doing."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["Cancellation", "JobContext"]


class Cancellation:
    """Why a run was cancelled, once it was: set by the scheduler, read by the
    run through `JobContext.cancelled` (from its worker thread, for a sync job)."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None


@dataclass(frozen=True, slots=True)
class JobContext:
    """Passed to a job that declares one parameter annotated ``JobContext``.

    Example:

    ```python
    # fragment: a job of an app whose lifespan yields its engine as "db"
    @scheduler.every(hours=1)
    async def expire_sessions(ctx: JobContext) -> None:
        async with ctx.state["db"].begin() as conn:
            ...
        ctx.logger.info("expired sessions for the tick %s", ctx.tick)
    ```
    """

    name: str
    """The job's name."""
    tick: datetime
    """The scheduled instant this run is for (aware, UTC); for a run started
    by hand or at startup, the instant it was started."""
    state: Mapping[str, Any]
    """What the app's lifespan yielded: the database pool, clients, ..."""
    logger: logging.Logger
    """The scheduler's logger for this job (a child named after the job)."""
    fence: int | None = None
    """With a store: a number that grows by one with each claim of this job
    across all instances; guard the job's own writes with it. Else None."""
    manual: bool = False
    """True when the run was asked for by hand (``Scheduler.run_now``)."""
    cancellation: Cancellation = field(default_factory=Cancellation, repr=False, compare=False)
    """Set by the scheduler when it cancels the run; read `cancelled`."""

    @property
    def cancelled(self) -> bool:
        """True once this run is cancelled: its lease lost (another instance may
        run the job's next tick now), the app stopping past its shutdown
        deadline, a newer tick replacing it, or its timeout passed.

        An async job's task is cancelled then, and need not look. A sync job's
        thread cannot be stopped from outside: it goes on until it returns. Look
        at ``ctx.cancelled`` between the steps of a long sync job, and return
        once it is true (its writes can also be fenced: `fence`):

        ```python
        # fragment: a long sync job of a scheduler with a store
        @scheduler.every(minutes=10)
        def reindex(ctx: JobContext) -> None:
            for batch in batches():
                if ctx.cancelled:
                    return  # the lease is lost: another instance may run the job now
                index(batch)
        ```
        """
        return self.cancellation.reason is not None

    @property
    def cancel_reason(self) -> str | None:
        """Why the run was cancelled (``"lease lost: ..."``, ``"timed out"``,
        ``"cancelled"``), or None while it is not."""
        return self.cancellation.reason
