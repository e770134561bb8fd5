"""What a job is told about the run it is doing."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["JobContext"]


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
