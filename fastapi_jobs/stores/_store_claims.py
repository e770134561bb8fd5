"""The claims' and releases' operations of ``SQLAlchemyStore`` (a base class of
it): a claim of many jobs in one operation, freed if its caller gives up; the
re-claim of abandoned hand-off ticks; releases in batches; and both at once,
the releases first, in one operation (`release_then_claim`), which is how the
scheduler sends an instant's claims with the releases gathered before them.

A claim may name an ``instant``: a set of jobs due together whose claims are
sent only by the instance that claims the instant first (see
``_claim_statements.claim_instant``); the others' claims of that set are
skipped, in the same operation, without a row sent."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import StoreError
from .._store import FUTURE_MARGIN, Ended, Instance
from . import _reads
from ._batches import (
    ahead,
    chunks,
    claim_all,
    claim_taking_over,
    clocked,
    each_row_alone_on_error,
    encode,
)
from ._db_clock import sqlite_now
from ._operations import NOT_OPEN, Operations, transaction
from ._statements import Statements, ended_rows
from ._tables import Tables

__all__ = ["StoreClaims"]

logger = logging.getLogger("fastapi_jobs.stores")
_T = TypeVar("_T")
_Fences = dict[str, int | Exception]
_Reclaimed = dict[str, int | tuple[float, float] | Exception]
_Versions = Mapping[str, int] | None
_ClaimOp = Callable[[_Fences, dict[str, float], AsyncConnection], Awaitable[_Fences]]
_Instant = tuple[str, float, Collection[str]] | None


class StoreClaims:
    """Claims and releases, for ``SQLAlchemyStore`` (which sets these)."""

    lease: float
    timeout: float
    history: int
    tables: Tables
    _operations: Operations
    _instance: Instance | None
    _sql: Statements | None

    instant_claims = True
    """`claim` and `release_then_claim` take ``instant=``: see `claim`."""

    async def claim(
        self,
        wanted: Sequence[tuple[str, float]],
        *,
        manual: bool = False,
        versions: _Versions = None,
        replace: Collection[str] = (),
        instant: _Instant = None,
        handoffs: Collection[str] = (),
    ) -> dict[str, int | Exception]:
        """Claim each ``(job, tick)`` in as few statements as can be (one per
        thousand rows); see `fastapi_jobs.stores.Store.claim`.

        ``instant``: ``(key, at, jobs)``, where ``jobs`` (of ``wanted``, each for
        the tick ``at``) are the set of jobs that come due together at ``at``,
        named by ``key``: their claims are sent only if this instance is the
        first to claim ``at`` for that set; else they are skipped, as if
        claimed elsewhere (the instance that claimed the instant claims them).
        Without the instants table (``create_tables=False``, not migrated),
        every claim is sent."""
        if not wanted:
            return {}
        op = self._claim_op(wanted, manual, versions, replace, instant, handoffs)
        return await self._claiming(op)

    async def release_then_claim(
        self,
        ended: Sequence[Ended],
        wanted: Sequence[tuple[str, float]],
        *,
        manual: bool = False,
        versions: _Versions = None,
        replace: Collection[str] = (),
        instant: _Instant = None,
        handoffs: Collection[str] = (),
    ) -> tuple[dict[str, Exception], dict[str, int | Exception]]:
        """`release` ``ended``, then `claim` ``wanted``, in one operation (one
        connection, one deadline): the refused releases by job, and the fences.
        A job's claim comes after its own previous run's release, so the tick
        after a run is never refused by that run's claim. Raises as either does
        (nothing claimed; the releases may have gone through: sent again, they
        change nothing)."""
        rows = ended_rows(ended)
        claim = (
            self._claim_op(wanted, manual, versions, replace, instant, handoffs) if wanted else None
        )

        async def both(
            fences: _Fences, asked: dict[str, float], conn: AsyncConnection
        ) -> tuple[dict[str, Exception], _Fences]:
            refused = await self._release_all(chunks(rows), conn) if rows else {}
            if claim is not None:
                await claim(fences, asked, conn)
            return _errors(refused), fences

        return await self._claiming(both)

    def _claim_op(
        self,
        wanted: Sequence[tuple[str, float]],
        manual: bool,
        versions: _Versions,
        replace: Collection[str],
        instant: _Instant = None,
        handoffs: Collection[str] = (),
    ) -> _ClaimOp:
        """The claim of ``wanted`` as ``op(fences, asked, conn)``, for `_claiming`."""
        if instant is not None:
            return partial(
                self._claim_at_instant, wanted, manual, versions, replace, instant, handoffs
            )
        rows: Sequence[tuple[Any, ...]] = wanted
        if versions:  # a stored schedule's row has a third value: its version
            rows = [(j, t) if j not in versions else (j, t, versions[j]) for j, t in wanted]
        # Hand-off jobs (overlap "replace" aside: it takes over any lease) take
        # only a released row: an abandoned one is `reclaim`'s, for its own tick.
        handing_off = set(handoffs).difference(replace) if handoffs and not manual else ()
        if handing_off:
            others = [row for row in rows if row[0] not in handing_off]
            first = [row for row in rows if row[0] in handing_off]
            rest = self._claim_op(others, manual, versions, replace) if others else None
            return partial(self._claim_handoffs, chunks(first), rest)
        if replace and not manual:
            taking = (self._statements.batches, rows, set(replace), self._claim_params())
            return partial(claim_taking_over, *taking, history=bool(self.history))
        kind = "claim_manual" if manual else "claim"
        return partial(self._claim_all, kind, chunks(rows))

    async def _claim_handoffs(
        self,
        rows: list[list[tuple[str, Any]]],
        rest: _ClaimOp | None,
        fences: _Fences,
        asked: dict[str, float],
        conn: AsyncConnection,
    ) -> _Fences:
        """The claims of hand-off jobs' ``rows`` (see `_claim_op`), then ``rest``."""
        await self._claim_all("claim_handoff", rows, fences, asked, conn)
        return fences if rest is None else await rest(fences, asked, conn)

    async def _claim_at_instant(
        self,
        wanted: Sequence[tuple[str, float]],
        manual: bool,
        versions: _Versions,
        replace: Collection[str],
        instant: tuple[str, float, Collection[str]],
        handoffs: Collection[str],
        fences: _Fences,
        asked: dict[str, float],
        conn: AsyncConnection,
    ) -> _Fences:
        """The instant's claim, then the claims of ``wanted``: all of them if
        this instance claimed the instant (or the store has no instants table:
        known once the operation has checked the tables), else only those
        outside its set."""
        key, at, jobs = instant
        sql = self._statements
        params = {**self._claim_params(), "b_key": key, "b_instant": at, "b_sent": sqlite_now()}
        if sql.instants:
            result = await sql.batches.execute(conn, "claim_instant", params)
            made, db_time = clocked(result.all(), conn.dialect.name)
            if not made:
                # Claimed elsewhere, or not yet due on the database's clock.
                ahead([row for row in wanted if row[0] in jobs], fences, db_time, FUTURE_MARGIN)
                wanted = [row for row in wanted if row[0] not in jobs]
                if not wanted:
                    return fences
        op = self._claim_op(wanted, manual, versions, replace, handoffs=handoffs)
        return await op(fences, asked, conn)

    async def reclaim(self, wanted: Sequence[tuple[str, float]]) -> _Reclaimed:
        """Claim again each ``(job, tick)`` that is claimed, never released and
        past its lease; see `fastapi_jobs.stores.Store.reclaim`."""
        if not wanted:
            return {}

        async def reclaim_all(
            fences: dict[str, int | Exception], asked: dict[str, float], conn: AsyncConnection
        ) -> _Reclaimed:
            await self._claim_all("reclaim", chunks(wanted), fences, asked, conn)
            others = [job for job, _ in wanted if job not in fences]
            # Why not: still held (by a live claimer, or for another tick), or free.
            held = await _reads.unreleased(conn, self.tables, others) if others else {}
            return {**held, **fences}

        return await self._claiming(reclaim_all, free=False)

    async def _claiming(self, claim_all: Callable[..., Awaitable[_T]], free: bool = True) -> _T:
        """Run ``claim_all(fences, asked, conn)`` as one operation, and free what
        it claimed if its caller gives up, if ``free``: not a re-claim's, whose row
        freed would look released (its abandoned tick never claimed again)."""
        # Filled as the operation goes, so that a caller who gives up can tell the
        # claims made from those whose answer never came.
        fences: dict[str, int | Exception] = {}
        asked: dict[str, float] = {}  # sent, not yet answered
        ops = self._operations
        sent = ops.spawn(ops.on_kept(partial(claim_all, fences, asked)))
        try:
            return await asyncio.shield(sent)
        except BaseException:
            # The caller gave up (its deadline, shutdown), or the operation failed
            # or hit its own deadline. Claims made all the same are run by nobody:
            # free them, or the jobs wait out a lease.
            if free:
                sent.add_done_callback(lambda _: self._abandoned(fences, asked))
            raise

    def _abandoned(self, fences: dict[str, int | Exception], asked: dict[str, float]) -> None:
        """Free what an abandoned claim operation may have claimed: the claims it
        reported, and those whose statement went out but whose answer was lost
        (cut by the deadline after the database had made it: a stall of this
        process, a slow link)."""
        made = [(job, fence) for job, fence in fences.items() if isinstance(fence, int)]
        unanswered = {job: tick for job, tick in asked.items() if job not in fences}
        if made or unanswered:
            self._operations.spawn(self._free_claims(made, unanswered))

    async def _free_claims(self, made: list[tuple[str, int]], unanswered: dict[str, float]) -> None:
        try:
            if unanswered:
                # Which of them were made: a claim of this tick by this instance
                # is one this instance gave up on (a tick is claimed once).
                held = partial(_reads.held_claims, tables=self.tables, owner=self._owner)
                rows = await self._operations.run(held)
                made += [(job, fence) for job, fence, tick in rows if unanswered.get(job) == tick]
            # Never ran: freed, with no run recorded (the job's last run stays).
            await self.release([Ended(job, fence, None, None, 0.0, 0) for job, fence in made])
        except Exception as exc:  # noqa: BLE001 - the claims free when their leases end
            logger.debug("could not free the claims of an abandoned claim: %r", exc)

    async def _claim_all(
        self,
        kind: str,
        chunks: list[list[tuple[str, Any]]],
        fences: dict[str, int | Exception],
        asked: dict[str, float],
        conn: AsyncConnection,
    ) -> dict[str, int | Exception]:
        params = self._claim_params()
        return await claim_all(self._statements.batches, kind, chunks, params, fences, asked, conn)

    def _claim_params(self) -> dict[str, object]:
        owner, lease, timeout = self._owner, self.lease, self.timeout
        return {"b_owner": owner, "b_lease": lease, "b_timeout": timeout, "b_early": FUTURE_MARGIN}

    async def renew(self, job: str, fence: int) -> bool:
        params = {"b_job": job, "b_fence": fence, "b_lease": self.lease}
        renew = self._statements.renew
        result = await self._operations.run(lambda conn: conn.execute(renew, params))
        return result.rowcount == 1

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        """Release these claims in as few statements as can be; see
        `fastapi_jobs.stores.Store.release`."""
        if not ended:
            return {}
        rows = ended_rows(ended)
        return _errors(await self._operations.run_kept(partial(self._release_all, chunks(rows))))

    async def _release_all(
        self, chunks: list[list[tuple[str, Any]]], conn: AsyncConnection
    ) -> dict[str, int | Exception]:
        failed: dict[str, int | Exception] = {}
        sql = self._statements

        async def release_rows(rows: list[tuple[str, Any]]) -> None:
            params: dict[str, object] = {"b_rows": encode(rows)}
            if sql.release_in_two:
                # Two statements, one transaction: a history row written by a
                # release whose update then failed would be written again when
                # the release is sent again.
                async with transaction(conn):
                    await sql.batches.execute(conn, "released_runs", params)
                    await sql.batches.execute(conn, "release", params)
            else:
                await sql.batches.execute(conn, "release", params)

        for chunk in chunks:
            await each_row_alone_on_error(release_rows, chunk, failed)
        return failed

    @property
    def _owner(self) -> str:
        if self._instance is None:
            raise StoreError(NOT_OPEN)
        return self._instance.id

    @property
    def _statements(self) -> Statements:
        if self._sql is None:
            raise StoreError(NOT_OPEN)
        return self._sql


def _errors(failed: Mapping[str, int | Exception]) -> dict[str, Exception]:
    return {job: error for job, error in failed.items() if isinstance(error, Exception)}
