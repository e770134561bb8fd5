"""The read side of a scheduler: each job's status here, the cluster's view from
the store, and the runs each job has had.

Reads never fail a status page: a store that cannot be read gives no cluster
view (``None``) and no claimed runs, and says so in the log. ``runs`` of one job
is the exception: its caller asked for them, and learns why they cannot be read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import anyio

from .._control import check_limit
from .._errors import StoreError
from .._status import ClusterView, ErrorInfo, JobStatus, RunRecord, state_word
from ..queues import handoff_key
from .lifecycle import CurrentRun
from .parts import Parts
from .pauses import Pauses
from .runner import JobRunner

__all__ = ["Reader"]


class Reader:
    """What a scheduler's jobs are, were and did, as plain data."""

    def __init__(self, parts: Parts, current: CurrentRun, pauses: Pauses) -> None:
        self._parts = parts
        self._current = current
        self._pauses = pauses
        self._applied: ClusterView | None = None  # the last reading whose pauses are applied

    def status(self) -> list[JobStatus]:
        return [self.snapshot(r) for r in self._parts.runners.values()]

    def job_status(self, name: str) -> JobStatus:
        return self.snapshot(self._parts.runner(name))

    async def cluster(
        self, jobs: Collection[str] | None = None, unwell: bool = False
    ) -> ClusterView | None:
        """With a store: every job's last run across instances (or of ``jobs``,
        at least, where the store can read only theirs), and the instances
        seen recently. None without a store, or when the store is unreachable."""
        store = self._parts.store
        if store is None or self._current.running is None:
            return None
        narrow = self._parts.capabilities.read_jobs
        try:
            with anyio.fail_after(store.timeout):
                if jobs is not None and narrow is not None:
                    return await narrow(jobs, unwell)
                return await store.read()
        except Exception as exc:  # noqa: BLE001 - a status page must not fail
            self._parts.logger.warning("cannot read the store for the status page: %r", exc)
            return None

    def statuses(
        self, view: ClusterView | None, names: Iterable[str] | None = None
    ) -> list[JobStatus]:
        """Every job's status (or those of ``names``, in that order), with
        ``view`` (a reading of the cluster) applied: each job's pause as the
        store has it, each claimed job's last run."""
        self._apply(view)
        if names is None:
            statuses = self.status()
        else:
            runners = self._parts.runners
            statuses = [self.snapshot(runners[n]) for n in names if n in runners]
        if view is not None:
            for status in statuses:
                if status.claims:
                    status.cluster = view.jobs.get(status.name)
        return statuses

    def in_state(self, view: ClusterView | None, state: str) -> list[str]:
        """The names of the jobs in ``state`` (a word of `state_word`), read from
        each job's runner and ``view``: a listing filtered by state builds no
        status for the jobs it leaves out (~1 µs a job; a status, ~15)."""
        self._apply(view)
        now = self._parts.ticking.now()
        claims = {} if view is None else view.jobs
        found = []
        for name, runner in self._parts.runners.items():
            until = runner.job.declared_pause if runner.pause_unknown else runner.paused_until
            cluster = claims.get(name) if claims and runner.store is not None else None
            word = state_word(
                until > now,
                runner.busy or (cluster is not None and cluster.running_on is not None),
                runner.stats.last_outcome if cluster is None else cluster.last_outcome,
            )
            if word == state:
                found.append(name)
        return found

    async def unwell(self) -> ClusterView | None:
        """A reading of the cluster that tells which jobs fail or run (`in_state`):
        where the store can, the claims whose last run failed or whose lease is
        live, and of the jobs this process saw fail (their claim may say they
        ran well since); not every claim."""
        seen = [
            name
            for name, runner in self._parts.runners.items()
            if runner.store is not None and runner.stats.last_outcome in ("failed", "timed_out")
        ]
        return await self.cluster(seen, unwell=True)

    def _apply(self, view: ClusterView | None) -> None:
        """The pauses of ``view`` applied, once for each reading (a listing's
        request may ask for its states and then for its page's statuses)."""
        if view is not None and view is not self._applied:
            self._pauses.apply_view(view)
            self._applied = view

    async def runs(self, name: str, limit: int) -> list[RunRecord]:
        parts = self._parts
        runner = parts.runner(name)
        limit = check_limit(limit)
        store = parts.store
        if store is not None and runner.leases is not None:
            if self._current.running is None:
                raise StoreError("the store opens when the scheduler starts")
            try:
                with anyio.fail_after(store.timeout):
                    records = await store.runs(name, limit)
            except Exception as exc:
                raise StoreError(
                    f"cannot read the run history of {name!r}: {ErrorInfo.of(exc)}"
                ) from exc
        else:
            history = runner.history
            records = [] if history is None else history.records(name, parts.instance.id, limit)
        await self._queue_ids({name: records})
        return records

    async def recent_runs(self, names: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        """The last ``limit`` runs (as `runs`) of each job of ``names``, the
        claimed ones in one read of the store; a store that cannot be read gives
        them none."""
        parts = self._parts
        found: dict[str, list[RunRecord]] = {}
        runners = {name: parts.runners[name] for name in names if name in parts.runners}
        claimed = [name for name, runner in runners.items() if runner.leases is not None]
        store = parts.store
        if claimed and store is not None and self._current.running is not None:
            try:
                with anyio.fail_after(store.timeout):
                    found.update(await store.recent_runs(claimed, limit))
            except Exception as exc:  # noqa: BLE001 - a status page must not fail
                parts.logger.warning("cannot read the run history for the status page: %r", exc)
        for name, runner in runners.items():
            if runner.leases is None and runner.history is not None:
                found[name] = runner.history.records(name, parts.instance.id, limit)
        await self._queue_ids(found)
        return found

    async def _queue_ids(self, found: dict[str, list[RunRecord]]) -> None:
        """Give the runs of hand-off jobs that went through their tick's queue
        job id: the one the store's outbox recorded (procrastinate's own id),
        else the tick's key (arq's job id, Celery's task id). Unknown (None)
        when the outbox cannot be read."""
        runners = self._parts.runners
        ok = [
            (name, record, record.tick)
            for name, records in found.items()
            if runners[name].job.enqueue is not None
            for record in records
            if record.outcome == "ok" and record.tick is not None
        ]
        if not ok:
            return
        recorded: Mapping[tuple[str, float], str] = {}
        store = self._parts.store
        outbox = self._parts.capabilities.outbox
        if store is not None and outbox is not None and self._current.running is not None:
            try:
                with anyio.fail_after(store.timeout):
                    recorded = await outbox.queue_ids([(n, t.timestamp()) for n, _, t in ok])
            except Exception as exc:  # noqa: BLE001 - a status page must not fail
                self._parts.logger.debug("cannot read the queue ids of hand-offs: %r", exc)
                return
        for name, record, tick in ok:
            record.queue_id = recorded.get((name, tick.timestamp())) or handoff_key(name, tick)

    def snapshot(self, runner: JobRunner) -> JobStatus:
        parts = self._parts
        handoff = runner.job.enqueue
        return runner.stats.snapshot(
            runner.job.name,
            parts.instance.id,
            runner.job.schedule.describe(),
            claims=runner.store is not None,
            running=runner.busy,
            paused_until=runner.job.declared_pause if runner.pause_unknown else runner.paused_until,
            now=parts.ticking.now(),
            hand_off=None if handoff is None else handoff.name,
            task=runner.job.task,
            policies=(runner.job.overlap, runner.job.jitter),
            scheduler=self._current.state,
        )
