"""A backfill's claim of a past tick as SQL (``_backfills``): what the job's
claim row and history say of the tick (`probe`), then the claim itself, made
only if the row is still as read (its fence unchanged: `take`; none yet:
`first`), and only while the job is the one the backfill began under
(`current`: a stored schedule changed or removed is claimed no more). Every
time comparison uses the database's clock (``_db_clock``); every bind is a
named one, ``b_...``.

Why two statements and not one: on PostgreSQL a single statement's check of
the history is made on its snapshot, taken before it waits for the claim row's
lock. A live release committed meanwhile (lease freed, history row written)
would pass unseen, and the tick run twice. A claim conditioned on the fence
read after that release cannot miss it: every claim moves the fence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from ._db_clock import db_now

__all__ = ["current", "first", "probe", "take"]

Insert = Callable[[sa.Table], Any]
"""The dialect's ``insert()``, which has ``ON CONFLICT``."""

_JOB = sa.bindparam("b_job", type_=sa.String)
_TICK = sa.bindparam("b_tick", type_=sa.Double)


_VERSION = sa.bindparam("b_version", type_=sa.BigInteger)


def current(schedules: sa.Table | None) -> Any:
    """Whether the backfill's job is still what it ran under (``b_version``):
    the stored schedule of that version, live (not changed, not removed); a
    declared job's (``b_version`` NULL) while no live stored schedule has its
    name. As a live claim's (``_claim_statements._current``): once a change
    or a removal is made on any instance, no backfill claims a tick of the old
    spec. Always true without a schedules table."""
    if schedules is None:
        return sa.true()
    s = schedules
    live = sa.and_(s.c.name == _JOB, s.c.removed == sa.false())
    return sa.case(
        (_VERSION.is_(None), ~sa.exists().where(live)),
        else_=sa.exists().where(live, s.c.version == _VERSION),
    )


def probe(claims: sa.Table, runs: sa.Table | None, schedules: sa.Table | None) -> Any:
    """One row: the job's claim row's ``fence``, ``last_tick`` and whether its
    lease is free (all NULL without a row), whether the history has a run of
    the tick, the database's time, and whether the job is `current`."""
    c, now = claims, db_now()
    row = sa.select(c).where(c.c.job == _JOB).subquery()
    free = sa.or_(row.c.lease_until.is_(None), row.c.lease_until < now)
    ran: Any = sa.false()
    if runs is not None:
        ran = sa.exists().where(runs.c.job == _JOB, runs.c.tick == _TICK)
    return sa.select(
        sa.select(row.c.fence).scalar_subquery(),
        sa.select(row.c.last_tick).scalar_subquery(),
        sa.select(free).scalar_subquery(),
        ran,
        now,
        current(schedules),
    )


def _claimed(now: Any) -> dict[str, Any]:
    return {
        "owner": sa.bindparam("b_owner", type_=sa.String),
        "lease_until": now + sa.bindparam("b_lease", type_=sa.Double),
        "started_at": now,
    }


def take(claims: sa.Table, schedules: sa.Table | None) -> Any:
    """The claim of the tick over the job's row as `probe` read it (``b_fence``):
    its lease free, the tick not its last one claimed, not in the future (with
    the live claim's early margin, ``b_early``). ``last_tick`` never moves back,
    so that a live instance lagging behind never claims an older tick again.
    A pause is not heeded: an operator asked for the runs."""
    c, now = claims, db_now()
    return (
        sa.update(c)
        .where(
            c.c.job == _JOB,
            c.c.fence == sa.bindparam("b_fence", type_=sa.BigInteger),
            sa.or_(c.c.lease_until.is_(None), c.c.lease_until < now),
            c.c.last_tick != _TICK,
            now + sa.bindparam("b_early", type_=sa.Double) >= _TICK,
            current(schedules),
        )
        .values(
            fence=c.c.fence + sa.literal_column("1", sa.BigInteger),
            last_tick=sa.case((c.c.last_tick < _TICK, _TICK), else_=c.c.last_tick),
            **_claimed(now),
        )
        .returning(c.c.fence)
    )


def first(claims: sa.Table, insert: Insert, schedules: sa.Table | None) -> Any:
    """The claim of a job that has no claim row yet: its row made, fence 1
    (nothing if a claim made it meanwhile: `probe` again)."""
    c, now = claims, db_now()
    claimed = _claimed(now)
    row = sa.select(
        _JOB,
        _TICK,
        sa.literal_column("1", sa.BigInteger),
        claimed["owner"],
        claimed["lease_until"],
        now,
    ).where(now + sa.bindparam("b_early", type_=sa.Double) >= _TICK, current(schedules))
    new = insert(c).from_select(
        ["job", "last_tick", "fence", "owner", "lease_until", "started_at"], row
    )
    return new.on_conflict_do_nothing(index_elements=[c.c.job]).returning(c.c.fence)
