"""Hand a job's ticks to a task queue: the seam (`Handoff`) its adapters fill.

A job declared with ``enqueue=<a Handoff>`` is a hand-off job: its function
returns the queue task's keyword arguments, and each run enqueues that task
under the key ``"<job>@<tick>"`` (`handoff_key`). The run is ok once the queue
has the task, and failed (recorded, retried within the tick with the same key)
when the enqueue raised. Adapters live in their own modules
(``fastapi_jobs.queues.arq``), each importing its queue library there only.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

__all__ = ["Handoff", "handoff_key"]


@runtime_checkable
class Handoff(Protocol):
    """Where a hand-off job's ticks go: one queue task.

    Example (arq; the app's lifespan yields ``{"arq": pool}``):

    ```python
    # fragment: a hand-off job (docs/queues.md has the whole app)
    from fastapi_jobs.queues.arq import ArqTask

    @scheduler.every(hours=1, enqueue=ArqTask("send_digest", pool=lambda s: s["arq"]))
    def digest() -> dict[str, object]:
        return {"audience": "all"}
    ```
    """

    name: str
    """What the tick goes to, shown in status (e.g. ``"arq task send_digest"``)."""

    async def enqueue(
        self, key: str, tick: datetime, kwargs: Mapping[str, Any], state: Mapping[str, Any]
    ) -> str:
        """Put the task in the queue under ``key`` with ``kwargs`` and return the
        queue's job id. A refusal as a duplicate of the same ``key`` is success
        (the queue has it); anything the queue raises is the run's failure.
        ``state``: the lifespan's state (where the app keeps its pool)."""
        ...


def handoff_key(job: str, tick: datetime) -> str:
    """The key of ``job``'s ``tick`` in the queue: ``"digest@2025-01-01T00:00:00Z"``
    (UTC; microseconds only for a tick that has them). The same (job, tick)
    always gives the same key, so a retry or a second instance enqueues the
    same job, which the queue can refuse."""
    tick = tick.astimezone(UTC)
    if tick.microsecond:
        return f"{job}@{tick:%Y-%m-%dT%H:%M:%S.%fZ}"
    return f"{job}@{tick:%Y-%m-%dT%H:%M:%SZ}"
