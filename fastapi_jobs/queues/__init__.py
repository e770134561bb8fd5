"""Hand a job's ticks to a task queue: the seam (`Handoff`) its adapters fill.

A job declared with ``enqueue=<a Handoff>`` is a hand-off job: its function
returns the queue task's keyword arguments, and each run enqueues that task
under the key ``"<job>@<tick>"`` (`handoff_key`). The run is ok once the queue
has the task, and failed (recorded, retried within the tick with the same key)
when the enqueue raised. Adapters live in their own modules
(``fastapi_jobs.queues.arq``), each importing its queue library there only.

A queue that cannot refuse a second task under the same key by itself uses the
store's `Outbox`: a row per (job, tick) in the app's database, which says
whether the tick was handed off already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from .._redaction import masked_repr

__all__ = ["Handoff", "HandoffRequest", "Outbox", "handoff_key"]


@runtime_checkable
class Outbox(Protocol):
    """The store's record of the ticks handed off, one row per (job, tick), in
    the app's own database (``SQLAlchemyStore``'s ``<prefix>handoffs`` table).

    ``once`` is for a queue that lives in the same database (procrastinate):
    the row and the task commit together. ``sending``/``sent`` are for one that
    does not (Celery's brokers): the row says whether a send went through.
    """

    @property
    def dialect(self) -> str:
        """The database's: ``"postgresql"`` or ``"sqlite"`` (``""`` until the store opens)."""
        ...

    async def once(self, job: str, tick: datetime, queue: str, insert: Any) -> tuple[str, bool]:
        """In one statement, so in one transaction: ``insert``, which puts the
        task in the same database (a SQLAlchemy statement returning the new
        job's id as its one column ``id``, e.g. ``text(...).columns(id=...)``),
        and the record of (job, tick). Returns that id and True; or, when (job,
        tick) was handed off before (committed by anyone), the id recorded then
        and False, with the insert undone. What the database raises is raised,
        and neither is made."""
        ...

    lease: float
    """Seconds the store holds a claim without renewal: a tick older than half
    of it may be one a peer claimed again after its claimer died (see
    `HandoffRequest.maybe_sent`)."""

    async def sending(self, job: str, tick: datetime, queue: str) -> str | None:
        """Before a send to a queue elsewhere that may have been made before
        (`HandoffRequest.maybe_sent`): record (job, tick) as about to be sent
        (if it is not recorded yet). Returns the queue's job id if a send of it
        went through before (then send nothing), else None."""
        ...

    async def sent(self, job: str, tick: datetime, queue: str, queue_id: str) -> None:
        """After a send went through: record it (a retry or a peer then sends
        nothing). A crash between the send and this leaves the tick to be sent
        again, under the same key."""
        ...

    async def queue_ids(
        self, ticks: Sequence[tuple[str, float]]
    ) -> Mapping[tuple[str, float], str]:
        """The queue's job ids recorded for these ``(job, tick)`` pairs (POSIX
        seconds), for the run history; pairs not handed off through the outbox
        are left out."""
        ...


@dataclass(frozen=True, slots=True)
class HandoffRequest:
    """One tick to enqueue, as `Handoff.enqueue` gets it."""

    job: str
    """The job's name."""
    tick: datetime
    """The tick (aware, UTC)."""
    key: str
    """``handoff_key(job, tick)``: the queue's job id, lock or task id."""
    kwargs: Mapping[str, Any]
    """The task's keyword arguments, as the job's function returned them (JSON values)."""
    state: Mapping[str, Any]
    """What the app's lifespan yielded (where the app keeps its queue client)."""
    outbox: Outbox | None = None
    """The store's `Outbox`, or None (no store, or one without an outbox)."""
    maybe_sent: bool = True
    """Whether an earlier attempt may have put this tick in the queue: a retry
    within the run, a tick older than half the store's lease (claimed again
    after its claimer died, or caught up). False for the first attempt of a
    tick just claimed, which a queue without its own refusal need not look up."""

    def __repr__(self) -> str:
        return masked_repr(self)  # kwargs hidden: a repr reaches tracebacks and logs


@runtime_checkable
class Handoff(Protocol):
    """Where a hand-off job's ticks go: one queue task.

    Example (arq; the app's lifespan yields ``{"arq": pool}``):

    ```python
    # fragment: a hand-off job (docs/guides/queues.md has the whole app)
    from fastapi_jobs.queues.arq import ArqTask

    @scheduler.every(hours=1, enqueue=ArqTask("send_digest", pool=lambda s: s["arq"]))
    def digest() -> dict[str, object]:
        return {"audience": "all"}
    ```
    """

    name: str
    """What the tick goes to, shown in status (e.g. ``"arq task send_digest"``)."""

    async def enqueue(self, request: HandoffRequest) -> str:
        """Put the task in the queue under ``request.key`` and return the
        queue's job id. A refusal as a duplicate of the same key is success
        (the queue has it); anything the queue raises is the run's failure."""
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
