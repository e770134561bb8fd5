"""The store's rows as the models the scheduler and the API show: a run of the
history as a ``RunRecord``, the claims and instances as a ``ClusterView``, a
pauses row as ``Store.pauses`` gives it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from .._clock import as_datetime
from .._status import ClusterJobStatus, ClusterView, ErrorInfo, InstanceStatus, RunRecord, utc

__all__ = ["cluster_view", "paused_until", "run_record"]


def paused_until(paused: bool, until: float | None) -> float:
    """A pauses row as ``Store.pauses`` gives it."""
    if not paused:
        return 0.0
    return math.inf if until is None else float(until)


def run_record(row: sa.RowMapping) -> RunRecord:
    """A row of the runs table, as the API shows it."""
    return RunRecord(
        id=str(row["fence"]),
        job=row["job"],
        tick=utc(row["tick"]),
        manual=bool(row["manual"]),
        attempts=row["attempts"],
        started_at=utc(row["started_at"]),
        finished_at=utc(row["finished_at"]),
        duration_s=row["duration"],
        outcome=row["outcome"],
        error=ErrorInfo.parse(row["error"]),
        instance=row["instance"],
        fence=row["fence"],
    )


def _job_status(row: sa.RowMapping, now: float, last_success: float | None) -> ClusterJobStatus:
    """A row of the claims table, read at ``now`` on the database's clock."""
    return ClusterJobStatus(
        last_tick=utc(row["last_tick"]),
        fence=row["fence"],
        last_started_at=utc(row["started_at"]),
        last_finished_at=utc(row["finished_at"]),
        last_duration_s=row["duration"],
        last_outcome=row["outcome"],
        last_error=ErrorInfo.parse(row["error"]),
        last_instance=row["owner"],
        last_success_at=utc(row["finished_at"] if row["outcome"] == "ok" else last_success),
        running_on=row["owner"]
        if row["lease_until"] is not None and row["lease_until"] > now
        else None,
    )


def _instance(row: sa.RowMapping) -> InstanceStatus:
    """A row of the instances table."""
    return InstanceStatus(
        id=row["id"],
        hostname=row["hostname"],
        pid=row["pid"],
        started_at=as_datetime(row["started_at"]),
        seen_at=as_datetime(row["seen_at"]),
    )


def cluster_view(
    now: float,
    claims: Sequence[sa.RowMapping],
    instances: Sequence[sa.RowMapping],
    pauses: Mapping[str, tuple[float, int]],
    successes: Mapping[str, float],
) -> ClusterView:
    """What the store knows, read at ``now``: ``claims`` and live ``instances``
    rows, ``pauses`` as ``Store.pauses`` gives them, and when each job whose last
    run failed last succeeded (``successes``)."""
    return ClusterView(
        pauses={job: until for job, (until, _) in pauses.items()},
        pause_versions={job: version for job, (_, version) in pauses.items()},
        read_at=float(now),
        jobs={row["job"]: _job_status(row, now, successes.get(row["job"])) for row in claims},
        instances=[_instance(row) for row in instances],
    )
