"""The store's side of a backfill (``SQLAlchemyStore.backfills``): the claim of
a past tick of a job, so that a tick that ran already (on any instance) is not
run again, and two backfills of one range, or a backfill beside the live app,
run each tick once. The run itself is released as any (``Store.release``, its
``Ended.tick`` the backfilled tick, which its history row records)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import StoreError
from .._store import Ended, Refused
from . import _backfill_statements as sql
from ._operations import NOT_OPEN, Operations
from ._tables import Tables

__all__ = ["Refused", "StoreBackfills"]

# A claim made between a probe and the claim moves the fence: probe again, a
# few times (each time a live claim won the race), then say the lease is held.
_RACES = 5


class _Store(Protocol):
    """What of ``SQLAlchemyStore`` a backfill's claim uses (it is that store's part)."""

    timeout: float
    tables: Tables
    _operations: Operations
    schedules: Any  # its StoreSchedules: ``present``, the table exists

    def _claim_params(self) -> dict[str, object]: ...
    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]: ...


class StoreBackfills:
    """Claims of past ticks, in the store's claims table."""

    def __init__(self, store: _Store) -> None:
        self._store = store

    async def claim(self, job: str, tick: float, version: int | None = None) -> int | Refused:
        """Claim ``job``'s past ``tick`` (a Unix time): its fence, or why not.
        ``version``: the stored schedule's the backfill runs (None: a declared
        job). Made within the store's ``timeout`` or given up (`TimeoutError`; a
        claim made all the same is freed); `StoreError` (or the driver's
        error) when the store cannot be reached."""
        store = self._store
        ops = store._operations
        if ops.engine is None:
            raise StoreError(NOT_OPEN)
        params = {**store._claim_params(), "b_job": job, "b_tick": tick, "b_version": version}
        sent = ops.spawn(ops.in_connection(lambda conn: self._claim(conn, params)))
        try:
            async with asyncio.timeout(store.timeout):
                return await asyncio.shield(sent)
        except BaseException:
            # The caller gave up: a claim made all the same is run by nobody.
            sent.add_done_callback(lambda done: self._abandoned(job, done))
            raise

    async def _claim(self, conn: AsyncConnection, params: dict[str, Any]) -> int | Refused:
        tables = self._store.tables
        schedules = tables.schedules if self._store.schedules.present else None
        insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        for _ in range(_RACES):
            probe = sql.probe(tables.claims, tables.runs, schedules)
            fence, last_tick, free, ran, _now, current = (await conn.execute(probe, params)).one()
            if not current:
                return "changed"
            if ran or last_tick == params["b_tick"]:
                return "ran"
            if fence is not None and not free:
                return "held"
            if fence is None:
                statement = sql.first(tables.claims, insert, schedules)
            else:
                statement = sql.take(tables.claims, schedules)
            got = (await conn.execute(statement, {**params, "b_fence": fence})).scalar()
            if got is not None:
                return int(got)
        return "held"

    def _abandoned(self, job: str, done: asyncio.Task[int | Refused]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        fence = done.result()
        if isinstance(fence, int):  # never ran: freed, no run recorded
            ended = Ended(job, fence, None, None, 0.0, 0, True)
            self._store._operations.spawn(self._store.release([ended]))
