"""The store's outbox: which ticks of hand-off jobs went to their queue.

A queue that cannot refuse a second task under the same key by itself (Celery's
brokers), or whose refusal does not last (procrastinate's ``queueing_lock``),
is made idempotent here: one row per (job, tick) in ``<prefix>handoffs``.

- ``once``: the row and the queue's own insert commit in one statement (a
  queue in the same database): a tick is in the queue once, whoever retries.
- ``sending``/``sent``: a send to a queue elsewhere is recorded after it went
  through; only a crash between the two leaves a tick to be sent again.

A retry, or a peer that claimed the tick again after the claimer died, sees
the row and sends nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import StoreError
from ._db_clock import db_now
from ._operations import NOT_OPEN, Operations
from ._tables import Tables

__all__ = ["StoreOutbox"]

# The queue's name is for people; its column is as wide as a job's name.
_QUEUE_NAME = 200


class StoreOutbox:
    """``fastapi_jobs.queues.Outbox`` on the store's ``handoffs`` table."""

    def __init__(self, operations: Operations, tables: Tables, lease: float) -> None:
        self._ops = operations
        self._table = tables.handoffs
        self.lease = lease

    @property
    def dialect(self) -> str:
        """The database's (``""`` until the store opens)."""
        engine = self._ops.engine
        return "" if engine is None else engine.dialect.name

    def _upsert(self, job: str, tick: datetime, queue: str) -> Any:
        """The row of (job, tick), inserted if absent; returns its ``sent_at``
        and ``queue_id``."""
        h = self._table
        if not self.dialect:
            raise StoreError(NOT_OPEN)
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        queue = queue[:_QUEUE_NAME]
        new = insert(h).values(job=job, tick=tick.timestamp(), queue=queue, created_at=db_now())
        return new.on_conflict_do_update(
            index_elements=[h.c.job, h.c.tick],
            set_={"queue": h.c.queue},  # unchanged: an upsert only to return (and lock) the row
        ).returning(h.c.sent_at, h.c.queue_id)

    def _of(self, job: str, tick: datetime) -> sa.ColumnElement[bool]:
        h = self._table
        return sa.and_(h.c.job == job, h.c.tick == tick.timestamp())

    async def once(self, job: str, tick: datetime, queue: str, insert: Any) -> tuple[str, bool]:
        h = self._table
        handed = insert.cte("handed")
        now = db_now()
        # One statement, so one transaction even on the store's AUTOCOMMIT
        # engine: the queue's insert, then the record of the tick, which a
        # record committed before (a retry, a peer that claimed the tick again)
        # refuses as a duplicate key, undoing the queue's insert with it. A
        # peer's statement in flight for the same tick holds the key until it
        # ends: this one then sees its outcome.
        record = (
            sa.insert(h)
            .from_select(
                ["job", "tick", "queue", "queue_id", "created_at", "sent_at"],
                sa.select(
                    sa.literal(job, sa.String),
                    sa.literal(tick.timestamp(), sa.Double),
                    sa.literal(queue[:_QUEUE_NAME], sa.String),
                    sa.cast(handed.c.id, sa.String),
                    now,
                    now,
                ),
            )
            .returning(h.c.queue_id)
        )
        recorded = sa.select(h.c.queue_id, h.c.sent_at).where(self._of(job, tick))
        pending = sa.delete(h).where(self._of(job, tick), h.c.sent_at.is_(None))

        async def op(conn: AsyncConnection) -> tuple[str, bool]:
            for _ in range(2):
                try:
                    return str((await conn.execute(record)).scalar_one()), True
                except sa.exc.IntegrityError:
                    row = (await conn.execute(recorded)).first()
                if row is not None and row.sent_at is not None:
                    return str(row.queue_id or ""), False
                # Recorded as about to be sent (`sending`, a send elsewhere that
                # never said it went through), or gone since: this insert decides.
                await conn.execute(pending)
            raise StoreError(f"the outbox's record of {job!r} at {tick} keeps changing")

        return await self._ops.run(op)

    async def sending(self, job: str, tick: datetime, queue: str) -> str | None:
        upsert = self._upsert(job, tick, queue)
        row = await self._ops.run(lambda conn: _first(conn, upsert))
        sent_at, queue_id = row
        return None if sent_at is None else str(queue_id or "")

    async def sent(self, job: str, tick: datetime, queue: str, queue_id: str) -> None:
        h = self._table
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        row = {"job": job, "tick": tick.timestamp(), "queue": queue[:_QUEUE_NAME]}
        done = insert(h).values(**row, queue_id=queue_id, created_at=db_now(), sent_at=db_now())
        done = done.on_conflict_do_update(
            index_elements=[h.c.job, h.c.tick],
            set_={"queue_id": done.excluded.queue_id, "sent_at": done.excluded.sent_at},
        )
        await self._ops.run(lambda conn: conn.execute(done))

    async def queue_ids(self, ticks: Sequence[tuple[str, float]]) -> dict[tuple[str, float], str]:
        if not ticks:
            return {}
        h = self._table
        wanted = set(ticks)
        # A superset by job and tick (a bound parameter per pair would not
        # scale), then the pairs asked.
        query = sa.select(h.c.job, h.c.tick, h.c.queue_id).where(
            h.c.job.in_({job for job, _ in ticks}),
            h.c.tick.in_({tick for _, tick in ticks}),
            h.c.queue_id.is_not(None),
        )
        rows = await self._ops.run(lambda conn: _all(conn, query))
        return {
            (job, float(tick)): str(queue_id)
            for job, tick, queue_id in rows
            if (job, float(tick)) in wanted
        }


async def _all(conn: AsyncConnection, statement: Any) -> list[Any]:
    return list((await conn.execute(statement)).all())


async def _first(conn: AsyncConnection, statement: Any) -> Any:
    return (await conn.execute(statement)).one()
