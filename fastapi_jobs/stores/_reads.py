"""The store's reads, each on a connection the store's operation gives: what
the cluster knows (claims, live instances, pauses, last successes), the run
history, a job's last tick, this instance's held claims, and the unreleased
claims of some jobs.

None of them writes; their rows become models in ``_models``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from .._status import ClusterView, RunRecord
from ._db_clock import db_now
from ._models import cluster_view, paused_until, run_record
from ._tables import Tables

__all__ = [
    "cluster",
    "held_claims",
    "last_tick",
    "pauses",
    "recent_runs",
    "runs",
    "unreleased",
]

# The last successes of at most this many jobs are asked by name (see
# _last_successes), and so are the recent runs.
_MAX_LISTED = 500


async def pauses(conn: AsyncConnection, tables: Tables) -> dict[str, tuple[float, int]]:
    """Each job's pause (until when, ``inf`` for good, 0 for none) and version."""
    p = tables.pauses
    rows = await conn.execute(sa.select(p.c.job, p.c.paused, p.c.until, p.c.version))
    return {
        job: (paused_until(paused, until), int(version))
        for job, paused, until, version in rows.all()
    }


async def cluster(
    conn: AsyncConnection,
    tables: Tables,
    *,
    heartbeat: float,
    history: int,
    jobs: Collection[str] | None = None,
    unwell: bool = False,
) -> ClusterView:
    """What the store knows now, on the database's clock: the claims of ``jobs``
    (None: of every job; past _MAX_LISTED names, of every job too), and with
    ``unwell`` those whose last run failed or timed out or whose lease is live."""
    c, i = tables.claims, tables.instances
    now = (await conn.execute(sa.select(db_now()))).scalar_one()
    claims = sa.select(c)
    if jobs is not None and len(jobs) <= _MAX_LISTED:
        wanted: sa.ColumnElement[bool] = c.c.job.in_(list(jobs))
        if unwell:
            failed = c.c.outcome.in_(("failed", "timed_out"))
            wanted = sa.or_(wanted, failed, c.c.lease_until > now)
        claims = claims.where(wanted)
    rows = (await conn.execute(claims)).mappings().all()
    # Instances count as live for three missed heartbeats.
    live = await conn.execute(
        sa.select(i).where(i.c.seen_at > now - 3 * heartbeat).order_by(i.c.started_at)
    )
    paused = await pauses(conn, tables)
    successes = await _last_successes(conn, tables, rows) if history else {}
    return cluster_view(now, rows, live.mappings().all(), paused, successes)


async def _last_successes(
    conn: AsyncConnection, tables: Tables, claims: Sequence[sa.RowMapping]
) -> dict[str, float]:
    """When the latest successful run of each job whose last run was not one
    ended: from the run history (the claims row keeps only the last run),
    for those jobs only (few, usually), through the (job, id) index."""
    jobs = [row["job"] for row in claims if row["outcome"] != "ok"]
    if not jobs:
        return {}
    r = tables.runs
    query = sa.select(r.c.job, sa.func.max(r.c.finished_at)).where(r.c.outcome == "ok")
    if len(jobs) <= _MAX_LISTED:  # else every job (a bound parameter per job has limits)
        query = query.where(r.c.job.in_(jobs))
    query = query.group_by(r.c.job)
    return {job: float(at) for job, at in (await conn.execute(query)).all()}


async def runs(conn: AsyncConnection, tables: Tables, job: str, limit: int) -> list[RunRecord]:
    """The newest ``limit`` runs of ``job``, newest first."""
    r = tables.runs
    query = sa.select(r).where(r.c.job == job).order_by(r.c.id.desc()).limit(limit)
    return [run_record(row) for row in (await conn.execute(query)).mappings().all()]


async def recent_runs(
    conn: AsyncConnection, tables: Tables, jobs: Sequence[str], limit: int
) -> dict[str, list[RunRecord]]:
    """The newest ``limit`` runs of each of ``jobs``, newest first."""
    r = tables.runs
    ranked = sa.select(
        r, sa.func.row_number().over(partition_by=r.c.job, order_by=r.c.id.desc()).label("n")
    )
    if len(jobs) <= _MAX_LISTED:  # else every job (a bound parameter per job has limits)
        ranked = ranked.where(r.c.job.in_(jobs))
    newest = ranked.subquery("newest")
    query = sa.select(newest).where(newest.c.n <= limit).order_by(newest.c.job, newest.c.id.desc())
    found: dict[str, list[RunRecord]] = {job: [] for job in jobs}
    for row in (await conn.execute(query)).mappings().all():
        if row["job"] in found:
            found[row["job"]].append(run_record(row))
    return found


async def last_tick(conn: AsyncConnection, tables: Tables, job: str) -> float | None:
    """The latest tick of ``job`` that any instance claimed."""
    c = tables.claims
    tick = await conn.scalar(sa.select(c.c.last_tick).where(c.c.job == job))
    return None if tick is None else float(tick)


async def held_claims(
    conn: AsyncConnection, tables: Tables, owner: str
) -> list[tuple[str, int, float]]:
    """The claims ``owner`` holds: (job, fence, tick)."""
    c = tables.claims
    query = sa.select(c.c.job, c.c.fence, c.c.last_tick).where(
        c.c.owner == owner, c.c.lease_until.is_not(None)
    )
    return [(job, fence, tick) for job, fence, tick in await conn.execute(query)]


async def unreleased(
    conn: AsyncConnection, tables: Tables, jobs: Sequence[str]
) -> dict[str, tuple[float, float]]:
    """The claims of ``jobs`` made and never released: the tick each holds, and
    the seconds left on its lease (negative: over), on the database's clock."""
    c = tables.claims
    rows = await conn.execute(
        sa.select(c.c.job, c.c.last_tick, c.c.lease_until - db_now()).where(
            c.c.job.in_(jobs), c.c.lease_until.is_not(None)
        )
    )
    return {job: (float(tick), float(left)) for job, tick, left in rows.all()}
