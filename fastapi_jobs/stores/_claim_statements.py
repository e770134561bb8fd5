"""The claims as SQL: a claim of many jobs' ticks in one statement, and the
claim again of abandoned hand-off ticks. Every time comparison uses the
database's clock (``_db_clock``); every bind is a named one, ``b_...``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from .._store import REPLACED_BY
from ._batches import rows_cte
from ._db_clock import db_now, db_received

__all__ = [
    "RUN_COLUMNS",
    "changed",
    "claim",
    "claim_instant",
    "reclaim",
    "replaced_runs",
    "wanted_rows",
    "with_clock",
]

Insert = Callable[[sa.Table], Any]
"""The dialect's ``insert()``, which has ``ON CONFLICT``."""


def claim(
    claims: sa.Table,
    pauses: sa.Table,
    insert: Insert,
    dialect: str,
    schedules: sa.Table | None = None,
    *,
    manual: bool = False,
    take_over: bool = False,
    released_only: bool = False,
) -> Any:
    """The claim of many jobs in one statement (rows as in ``rows_cte``). A paused
    job's tick is not claimed, unless ``manual`` (an operator asked for the run);
    with ``schedules``, see `_current`. ``take_over``: the jobs' overlap policy is
    ``replace``, and a lease still held does not stop the claim (`replaced_runs`
    records the run it replaces first). ``released_only``: the jobs hand their
    ticks to a queue, and a row claimed and never released is not taken even
    once its lease is over (see `_taken_over`)."""
    c, now = claims, db_now()
    lease = sa.bindparam("b_lease", type_=sa.Double)
    wanted = wanted_rows(dialect)
    due = sa.select(
        wanted.c.job,
        wanted.c.tick,
        sa.literal_column("1", sa.BigInteger),
        sa.bindparam("b_owner", type_=sa.String),
        now + lease,
        now,
    ).where(*_claimable(wanted, pauses, schedules, now, manual=manual))
    new = insert(c).from_select(
        ["job", "last_tick", "fence", "owner", "lease_until", "started_at"], due
    )
    taken = _taken_over(claims, new, now, take_over, released_only=released_only)
    return taken.returning(c.c.job, c.c.fence)


def claim_instant(instants: sa.Table, insert: Insert) -> Any:
    """The claim of an instant for a set of jobs due at it (``b_key``, a digest
    of their names, and ``b_instant``): made, returning a row, only if no
    instance claimed that instant or a later one for the same set. Under the
    conditions of every claim: not ahead of the database's clock (a host whose
    clock jumped must not take the set's next instants from the others), and
    not after the caller gave up."""
    i, now = instants, db_now()
    instant = sa.bindparam("b_instant", type_=sa.Double)
    row = sa.select(
        sa.bindparam("b_key", type_=sa.String),
        instant,
        sa.bindparam("b_owner", type_=sa.String),
        now,
    ).where(
        instant <= now + sa.bindparam("b_early", type_=sa.Double),
        now < db_received() + sa.bindparam("b_timeout", type_=sa.Double),
    )
    new = insert(i).from_select(["key", "instant", "owner", "claimed_at"], row)
    return new.on_conflict_do_update(
        index_elements=[i.c.key],
        set_={
            "instant": new.excluded.instant,
            "owner": new.excluded.owner,
            "claimed_at": new.excluded.claimed_at,
        },
        where=i.c.instant < new.excluded.instant,
    ).returning(i.c.key)


def changed(schedules: sa.Table, dialect: str) -> Any:
    """The rows of a claim (its ``b_rows``) that `_current` refuses for their
    version: a stored schedule's tick asked under a version its row no longer
    has (changed, or removed, since the claimer read it). Returned beside the
    claims, each as ``(job, NULL)``, so that the claimer is told the true reason
    and reads the change at once, rather than taking the tick as claimed
    elsewhere. The rows are a CTE of their own: a CTE read twice is
    materialized by PostgreSQL, which then plans the claim itself blind (a
    nested loop over every stored schedule for each row)."""
    s, wanted = schedules, wanted_rows(dialect, "asked")
    return sa.select(wanted.c.job, sa.cast(sa.null(), sa.BigInteger)).where(
        wanted.c.version.is_not(None),
        sa.exists().where(s.c.name == wanted.c.job, s.c.version != wanted.c.version),
    )


def with_clock(returning: Any, also: Any = None) -> Any:
    """``returning`` (a claim with RETURNING) as a data-modifying CTE (PostgreSQL)
    whose rows get one column more, NULL, and which returns one row more: all
    NULL but that column, the database's clock as the statement ran.

    A claim refused returns no row, whatever the reason; with the clock beside
    it, the store tells a tick still in the future on the database's clock from
    one claimed elsewhere, and the scheduler learns the database's time at once
    (its estimate of it is only as fresh as the last heartbeat). One statement,
    as before: no round trip more. SQLite needs none of it: its clock is this
    host's, read in Python (``sqlite_now``)."""
    made = returning.cte("made")
    clock = sa.cast(sa.null(), sa.Double)
    nothing = [sa.null() for _ in made.c]
    parts = [sa.select(*made.c, clock), sa.select(*nothing, db_now())]
    if also is not None:
        # Rows of another kind (`changed`'s), told apart by a NULL fence.
        parts.append(also.add_columns(clock))
    return sa.union_all(*parts)


def wanted_rows(dialect: str, name: str = "wanted") -> Any:
    """The CTE of a claim's rows: ``(job, tick, version)``, the version only for
    a stored schedule's."""
    return rows_cte(name, {"job": sa.String, "tick": sa.Double, "version": sa.BigInteger}, dialect)


def _claimable(
    wanted: Any, pauses: sa.Table, schedules: sa.Table | None, now: Any, *, manual: bool
) -> list[Any]:
    """The conditions on a row of ``wanted`` that may be claimed at all."""
    # The tick is not in the future on the database's clock (a host whose clock
    # jumped ahead must not move `last_tick` past the ticks the others are about
    # to claim), and the statement did not wait past the timeout (its caller
    # gave up).
    conditions = [
        wanted.c.tick <= now + sa.bindparam("b_early", type_=sa.Double),
        now < db_received() + sa.bindparam("b_timeout", type_=sa.Double),
    ]
    if not manual:
        # A pause taken on any instance holds from the next claim on: one
        # primary-key probe per row, in the claim's own statement.
        conditions.append(_not_paused(pauses, wanted.c.job, now))
    if schedules is not None:
        conditions.append(_current(schedules, wanted))
    return conditions


RUN_COLUMNS = [
    "job",
    "fence",
    "tick",
    "manual",
    "attempts",
    "started_at",
    "finished_at",
    "duration",
    "outcome",
    "error",
    "instance",
]
"""The columns a history row is written with, in the order its selects give them."""


def replaced_runs(
    claims: sa.Table,
    pauses: sa.Table,
    runs: sa.Table,
    dialect: str,
    schedules: sa.Table | None = None,
) -> Any:
    """The history rows of the runs that a ``take_over`` claim (same ``b_rows``)
    is about to replace: a claim still held, of an older tick, whose new claim
    meets `claim`'s conditions. Sent just before it, in its transaction; on
    PostgreSQL the claims' rows are locked, so a release that comes between the
    two is waited for, and its run is not recorded twice."""
    c, now = claims, db_now()
    wanted = wanted_rows(dialect)
    held = (
        sa.select(
            c.c.job,
            c.c.fence,
            c.c.last_tick,
            sa.false(),
            sa.literal_column("1", sa.Integer),
            c.c.started_at,
            now,
            sa.case(
                (now > c.c.started_at, now - c.c.started_at),
                else_=sa.literal_column("0.0", sa.Double),
            ),
            sa.literal_column("'cancelled'", sa.String),
            # Constants as SQL, not binds: every bind is a named one (``b_...``).
            sa.literal_column(f"'{REPLACED_BY}'", sa.Text)
            + sa.bindparam("b_owner", type_=sa.String),
            c.c.owner,
        )
        .join_from(wanted, c, c.c.job == wanted.c.job)
        .where(
            c.c.lease_until.is_not(None),
            c.c.lease_until >= now,
            c.c.last_tick < wanted.c.tick,
            *_claimable(wanted, pauses, schedules, now, manual=False),
        )
    )
    if dialect == "postgresql":
        held = held.with_for_update(of=c)
    return sa.insert(runs).from_select(RUN_COLUMNS, held)


def _taken_over(
    claims: sa.Table, new: Any, now: Any, take_over: bool = False, *, released_only: bool = False
) -> Any:
    """A claim's insert, over the job's row where it may be claimed.

    A tick must be newer than the last one claimed (so a tick never runs
    twice), and the previous lease must be free (so runs never overlap
    across instances), unless ``take_over``. Rows that fail return nothing. (A
    job's very first claim inserts its row.) The last run's end (finished_at,
    outcome, error, duration) stays until this run's release: while a run goes,
    the status shows the run before it, not nothing.

    A lease is free once released, or once over. ``released_only`` (hand-off
    jobs): once released only. A hand-off's claimer that died left its tick
    perhaps not enqueued, and only `reclaim` takes that row, for that very
    tick: a claim of a later tick, sent as the lease ends, would otherwise move
    the row past it, and the abandoned tick would be enqueued by nobody."""
    c = claims
    released = c.c.lease_until.is_(None)
    free = released if released_only else sa.or_(released, c.c.lease_until < now)
    return new.on_conflict_do_update(
        index_elements=[c.c.job],
        set_={
            "last_tick": new.excluded.last_tick,
            "fence": c.c.fence + sa.literal_column("1", sa.BigInteger),
            "owner": new.excluded.owner,
            "lease_until": new.excluded.lease_until,
            "started_at": new.excluded.started_at,
        },
        where=c.c.last_tick < new.excluded.last_tick
        if take_over
        else sa.and_(c.c.last_tick < new.excluded.last_tick, free),
    )


def _current(schedules: sa.Table, wanted: Any) -> Any:
    """The schedule of ``wanted``'s job is the one its claimer runs: a stored
    schedule's tick (a row with a third value, its version) is claimed only
    under the version its row has, so that a change or a removal made on any
    instance holds from the next claim on, before the claimer has read it; a
    declared job's (two values) only while no live stored schedule has its
    name. One primary-key probe per row."""
    s, version = schedules, wanted.c.version
    return ~sa.exists().where(
        s.c.name == wanted.c.job,
        sa.or_(
            sa.and_(version.is_(None), s.c.removed == sa.false()),
            sa.and_(version.is_not(None), s.c.version != version),
        ),
    )


def _not_paused(pauses: sa.Table, job: Any, now: Any) -> Any:
    p = pauses
    return ~sa.exists().where(
        p.c.job == job,
        p.c.paused == sa.true(),
        sa.or_(p.c.until.is_(None), p.c.until > now),
    )


def reclaim(claims: sa.Table, pauses: sa.Table, dialect: str) -> Any:
    """The claim again of abandoned hand-off ticks (rows ``(job, tick)`` as in
    ``rows_cte``): a row is taken over, with a new fence, owner and lease, only
    while it still holds that very tick, claimed and never released, its lease
    over on the database's clock. Only for hand-off jobs, whose enqueue is keyed
    by the tick (a second one is refused by the queue): an in-process run is
    never claimed twice. Paused jobs and deadlines as for `claim`."""
    c, now = claims, db_now()
    wanted = rows_cte("wanted", {"job": sa.String, "tick": sa.Double}, dialect)
    return (
        sa.update(c)
        .where(
            c.c.job == wanted.c.job,
            c.c.last_tick == wanted.c.tick,
            c.c.lease_until.is_not(None),
            c.c.lease_until < now,
            now < db_received() + sa.bindparam("b_timeout", type_=sa.Double),
            _not_paused(pauses, c.c.job, now),
        )
        .values(
            fence=c.c.fence + sa.literal_column("1", sa.BigInteger),
            owner=sa.bindparam("b_owner", type_=sa.String),
            lease_until=now + sa.bindparam("b_lease", type_=sa.Double),
            started_at=now,
        )
        .returning(c.c.job, c.c.fence)
    )
