"""The store's writes as SQL: releases (with their history rows), renewals,
heartbeats, pause changes, and the retention of the history; and `Statements`,
which holds them (and the claims of ``_claim_statements``) built for one database.

Every time comparison uses the database's clock (``_db_clock``). Statements
name every bind ``b_...``: the batch ones (claims, releases) run as driver SQL
(see ``_batches.Compiled``), which gets only the parameters we pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from .._store import Ended
from ._batches import Compiled, rows_cte
from ._claim_statements import (
    RUN_COLUMNS,
    changed,
    claim,
    claim_instant,
    reclaim,
    replaced_runs,
    with_clock,
)
from ._db_clock import db_now
from ._tables import Tables

__all__ = ["CLOCKED", "VERSIONED", "Statements"]

CLOCKED = frozenset({"claim", "claim_manual", "claim_replace", "claim_handoff", "claim_instant"})
"""The claims whose statements also return the database's clock (PostgreSQL:
``_claim_statements.with_clock``): a claim refused for a tick still in the
future on it is told from one refused for any other reason."""
VERSIONED = "+changed"
"""A claim's kind with this suffix: the batch holds stored schedules' ticks, and
(on PostgreSQL) its statement returns those refused for their version."""
_OUTBOX_KEPT = 86400.0
_REMOVED_KEPT = 86400.0
# A set of jobs whose instant was not claimed for this long has its row
# deleted: it is made again at the set's next claim, and decides nothing.
_INSTANT_KEPT = 86400.0

Insert = Callable[[sa.Table], Any]
"""The dialect's ``insert()``, which has ``ON CONFLICT``."""


class Statements:
    """The store's statements for one dialect (``postgresql`` or ``sqlite``),
    built when the store opens; the batch ones compile on first use."""

    def __init__(self, tables: Tables, dialect: str, *, history: bool) -> None:
        insert: Insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        self.dialect = dialect
        self.renew = renew(tables.claims)
        self.beat = beat(tables.instances, insert)
        self.pause = pause(tables.pauses, insert)
        self.prune_old, self.prune_extra = prune(tables.runs)
        h = tables.handoffs
        self.prune_outbox = sa.delete(h).where(
            h.c.created_at < sa.bindparam("b_before", type_=sa.Double)
        )
        s = tables.schedules
        self.prune_removed = sa.delete(s).where(
            s.c.removed == sa.true(), s.c.updated_at < sa.bindparam("b_before", type_=sa.Double)
        )
        i = tables.instants
        self.prune_instants = sa.delete(i).where(
            i.c.instant < sa.bindparam("b_before", type_=sa.Double)
        )
        # SQLite writes a release's history in a statement of its own, first.
        self.release_in_two = history and dialect == "sqlite"
        self.batches = Compiled(self._batch)
        self.schedules = True
        """The schedules table exists: claims check the versions of stored
        schedules against it (set when the tables are checked, before the
        claim statement is first compiled)."""
        self.instants = True
        """The instants table exists (set when the tables are checked): else
        every claim is sent, as before it was made."""
        self._tables, self._insert, self._history = tables, insert, history

    @property
    def hot(self) -> tuple[str, ...]:
        """The batch statements of every instant, compiled when the tables are checked."""
        kinds = (
            ("claim", "release", "released_runs") if self.release_in_two else ("claim", "release")
        )
        return (*kinds, "claim_instant") if self.instants else kinds

    async def prune(self, conn: AsyncConnection, *, history: int, max_age: float) -> None:
        """The retention of the history (its last ``history`` runs of each job, for
        at most ``max_age`` seconds), of the outbox and of the schedules' removals."""
        now = float((await conn.execute(sa.select(db_now()))).scalar_one())
        if self.schedules:
            # A removal's row is read by every instance within a heartbeat; one
            # away for longer reads every row again when it starts.
            await conn.execute(self.prune_removed, {"b_before": now - _REMOVED_KEPT})
        if self.instants:
            await conn.execute(self.prune_instants, {"b_before": now - _INSTANT_KEPT})
        # An outbox row refuses a second hand-off of its tick: kept as long as
        # the history, at least a day (a retry or re-claim is minutes away).
        await conn.execute(self.prune_outbox, {"b_before": now - max(max_age, _OUTBOX_KEPT)})
        if history:
            await conn.execute(self.prune_old, {"b_before": now - max_age})
            await conn.execute(self.prune_extra, {"b_keep": history})

    def _batch(self, kind: str) -> Any:
        t = self._tables
        schedules = t.schedules if self.schedules else None
        # A claim of stored schedules' ticks ("...+changed", PostgreSQL) also
        # returns the rows refused for their version; a batch of declared jobs'
        # ticks alone pays nothing for it (its statement has no such part).
        kind, versioned = kind.removesuffix(VERSIONED), kind.endswith(VERSIONED)
        if kind in CLOCKED:
            if kind == "claim_instant":
                made = claim_instant(t.instants, self._insert)
                return with_clock(made) if self.dialect == "postgresql" else made
            made = claim(
                *(t.claims, t.pauses, self._insert, self.dialect, schedules),
                manual=kind == "claim_manual",
                take_over=kind == "claim_replace",
                released_only=kind == "claim_handoff",
            )
            if self.dialect != "postgresql":
                return made  # its refusals for a version: `claim_changed`, after it
            told = changed(schedules, self.dialect) if versioned and schedules is not None else None
            return with_clock(made, told)
        if kind == "claim_changed":
            assert schedules is not None
            return changed(schedules, self.dialect)
        if kind == "replaced_runs":
            return replaced_runs(t.claims, t.pauses, t.runs, self.dialect, schedules)
        if kind == "reclaim":
            return reclaim(t.claims, t.pauses, self.dialect)
        runs = t.runs if self._history else None
        if kind == "released_runs":
            assert runs is not None
            return released_runs(t.claims, runs, self.dialect)
        return release(t.claims, runs, self.dialect)


def renew(claims: sa.Table) -> Any:
    """A lease's renewal (``b_job``, ``b_fence``, ``b_lease``)."""
    c = claims
    ours = sa.and_(c.c.job == sa.bindparam("b_job"), c.c.fence == sa.bindparam("b_fence"))
    # A released claim stays released: a late renewal must not re-take it.
    lease = sa.bindparam("b_lease", type_=sa.Double)
    return (
        sa.update(c).where(ours, c.c.lease_until.is_not(None)).values(lease_until=db_now() + lease)
    )


def beat(instances: sa.Table, insert: Insert) -> Any:
    """An instance's heartbeat (``b_id``, ``b_hostname``, ``b_pid``), returning
    the database's time."""
    i, now = instances, db_now()
    seen = insert(i).values(
        id=sa.bindparam("b_id"),
        hostname=sa.bindparam("b_hostname"),
        pid=sa.bindparam("b_pid"),
        started_at=now,
        seen_at=now,
    )
    return seen.on_conflict_do_update(
        index_elements=[i.c.id], set_={"seen_at": seen.excluded.seen_at}
    ).returning(i.c.seen_at)


def pause(pauses: sa.Table, insert: Insert) -> Any:
    """The change of one job's pause (``b_job``, ``b_paused``, ``b_until``,
    ``b_by``), made only before ``b_before`` on the database's clock, returning
    the row's new version (no row back: too late, nothing changed).

    The deadline is checked when the statement has its locks (a table locked,
    the job's row held by another change), so a change whose caller was told
    it came too late is never made afterwards. The version grows by one with
    each change of the row and is never below the database's clock in
    microseconds, so it also grows across the table dropped and made again
    (whose rows would start over at 1 and look older than the ones before)."""
    p, now = pauses, db_now()
    in_time = now < sa.bindparam("b_before", type_=sa.Double)
    clock = sa.cast(now * sa.literal_column("1000000"), sa.BigInteger)
    change = sa.select(
        sa.bindparam("b_job", type_=sa.String),
        sa.bindparam("b_paused", type_=sa.Boolean),
        sa.bindparam("b_until", type_=sa.Double),
        now,
        sa.bindparam("b_by", type_=sa.String),
        clock,
    ).where(in_time)
    new = insert(p).from_select(
        ["job", "paused", "until", "changed_at", "changed_by", "version"], change
    )
    return new.on_conflict_do_update(
        index_elements=[p.c.job],
        set_={
            "paused": new.excluded.paused,
            "until": new.excluded.until,
            "changed_at": new.excluded.changed_at,
            "changed_by": new.excluded.changed_by,
            "version": sa.case(
                (p.c.version < new.excluded.version, new.excluded.version),
                else_=p.c.version + sa.literal_column("1", sa.BigInteger),
            ),
        },
        where=in_time,  # again once the row is locked: a wait for it counts
    ).returning(p.c.version)


_ENDED = {
    "job": sa.String,
    "fence": sa.BigInteger,
    "outcome": sa.String,
    "error": sa.Text,
    "duration": sa.Double,
    "attempts": sa.Integer,
    "manual": sa.Integer,
    "tick": sa.Double,
}
"""The columns of a release's rows (``fastapi_jobs.stores.Ended``)."""


def ended_rows(ended: Sequence[Ended]) -> list[tuple[Any, ...]]:
    """A release's rows, each in ``_ENDED``'s order (the job first, as `chunks`
    wants it). The tick goes only where it is not the claim's: a value missing
    at the end of a row reads as NULL."""
    return [
        (*e[:6], int(e.manual)) if e.tick is None else (*e[:6], int(e.manual), e.tick)
        for e in ended
    ]


def _history(runs: sa.Table, source: Any, owner: Any, *where: Any) -> Any:
    """The history rows of released claims, from ``source`` (which has the
    claim's columns and the release's), those that match ``where``."""
    return sa.insert(runs).from_select(
        RUN_COLUMNS,
        sa.select(
            source.c.job,
            source.c.fence,
            sa.func.coalesce(source.c.tick, source.c.last_tick),
            source.c.manual != sa.literal_column("0"),
            source.c.attempts,
            source.c.started_at,
            source.c.finished_at,
            source.c.duration,
            source.c.outcome,
            source.c.error,
            owner,
        ).where(*where),
    )


def release(claims: sa.Table, runs: sa.Table | None, dialect: str) -> Any:
    """The release of many claims in one statement (rows as in ``rows_cte``);
    every bind is a named one. On PostgreSQL with ``runs``, the same statement
    writes the history rows (on SQLite, `released_runs` does, first)."""
    c = claims
    v = rows_cte("ended", _ENDED, dialect)
    ran = v.c.outcome.is_not(None)

    def if_ran(value: Any, kept: Any) -> Any:
        # A claim whose run never started (outcome NULL) is only freed: the
        # job's last run stays what it was.
        return sa.case((ran, value), else_=kept)

    # Only the claim `fence` is released, once: not a newer claim of the job,
    # and a release sent again (its first reply lost) adds no history row.
    statement = (
        sa.update(c)
        .where(c.c.job == v.c.job, c.c.fence == v.c.fence, c.c.lease_until.is_not(None))
        .values(
            lease_until=sa.null(),
            finished_at=if_ran(db_now(), c.c.finished_at),
            outcome=if_ran(v.c.outcome, c.c.outcome),
            error=if_ran(v.c.error, c.c.error),
            duration=if_ran(v.c.duration, c.c.duration),
        )
    )
    if runs is None or dialect != "postgresql":
        return statement
    released = statement.returning(
        c.c.job,
        c.c.fence,
        c.c.last_tick,
        c.c.started_at,
        c.c.finished_at,
        c.c.owner,
        v.c.outcome,
        v.c.error,
        v.c.duration,
        v.c.attempts,
        v.c.manual,
        v.c.tick,
    ).cte("released")
    return _history(runs, released, released.c.owner, released.c.outcome.is_not(None))


def released_runs(claims: sa.Table, runs: sa.Table, dialect: str) -> Any:
    """SQLite's history rows of a release (same ``b_rows``), sent just before
    its update in the same connection: SQLite cannot insert from an UPDATE's
    RETURNING in one statement. The rows still unreleased are the ones the
    update is about to release."""
    c = claims
    v = rows_cte("ended", _ENDED, dialect)
    source = (
        sa.select(
            c.c.job,
            c.c.fence,
            c.c.last_tick,
            c.c.started_at,
            db_now().label("finished_at"),
            c.c.owner,
            v.c.outcome,
            v.c.error,
            v.c.duration,
            v.c.attempts,
            v.c.manual,
            v.c.tick,
        )
        .join_from(v, c, sa.and_(c.c.job == v.c.job, c.c.fence == v.c.fence))
        .where(c.c.lease_until.is_not(None), v.c.outcome.is_not(None))
        .subquery("released")
    )
    return _history(runs, source, source.c.owner)


def prune(runs: sa.Table) -> tuple[Any, Any]:
    """The history's retention: rows older than ``b_before``, and each job's
    rows past its newest ``b_keep``."""
    ranked = sa.select(
        runs.c.id,
        sa.func.row_number().over(partition_by=runs.c.job, order_by=runs.c.id.desc()).label("n"),
    ).subquery("ranked")
    old = sa.delete(runs).where(runs.c.finished_at < sa.bindparam("b_before", type_=sa.Double))
    extra = sa.delete(runs).where(
        runs.c.id.in_(
            sa.select(ranked.c.id).where(ranked.c.n > sa.bindparam("b_keep", type_=sa.Integer))
        )
    )
    return old, extra
