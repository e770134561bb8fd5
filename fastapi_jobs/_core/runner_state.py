"""What the dispatcher reads and sets of one job: the runner's state.

The dispatcher (``_core.dispatcher``) decides when a job is due and drops the ticks
that come while it runs; it does so by reading and setting plain attributes
of the job's runner (``in_flight``, ``due``, ``fence``, ``grid_us``...) and
calling the few methods here (``place``, ``advance``, ``skipped``, ``wake``,
``settle``), which must stay cheap: they run once per job per tick. All of a
runner's slots are declared here; the layers on top (``_core.attempt``: one
guarded run; ``_core.tick_runs``: a tick's runs, claimed or retried;
``_core.runner``: the job's task) add behaviour only.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._clock import Clock
from .._job import Job
from .._policies import Jittered
from .._results import Manual, SkipReason
from .._schedules import Every
from .._status import JobStats
from .._store import Ended
from .history import History
from .leases import Lease, LeaseKeeper

if TYPE_CHECKING:
    from .claims import Claims
    from .concurrency import Gate, TaskHandle
    from .observers import Observers

__all__ = ["HISTORY", "Dispatching", "RunnerState", "Spawning"]

_US = 1_000_000
HISTORY = 50
"""Runs of each unclaimed job this process remembers, by default (``Scheduler(history=)``)."""


# The runner these take is a JobRunner, the layer above this one: typed Any so
# that this module does not import it (not even for type checking: no cycle).


_GRIDS = (Every, Jittered)  # the schedules whose ticks step on a grid of integer µs


class Dispatching(Protocol):
    """What a job's task needs of the dispatcher (``_dispatcher.Dispatcher``)."""

    def add(self, runner: Any, tick: float) -> None: ...


class Spawning(Protocol):
    """What a runner needs of the owner of the jobs' tasks (``_tasks.JobTasks``)."""

    def spawn(self, runner: Any) -> None: ...


class RunnerState:
    """One job's state in a running scheduler, and what the dispatcher does with it."""

    __slots__ = (
        "_catch_up",
        "_claims",
        "_clock",
        "_gate",
        "_handle",
        "_keep",
        "_lease",
        "_logger",
        "_parent_logger",
        "_retry_wait",
        "_scope",
        "_serving",
        "_tasks",
        "claimed_at",
        "due",
        "fence",
        "grid_us",
        "grouped",
        "history",
        "in_flight",
        "job",
        "leases",
        "manual",
        "observers",
        "pause_unknown",
        "paused_until",
        "period_us",
        "queued",
        "replaced_by",
        "retired",
        "stats",
        "stopping",
        "store",
        "thread_done",
        "woken",
    )

    def __init__(
        self,
        job: Job,
        clock: Clock,
        logger: logging.Logger,
        leases: LeaseKeeper | None = None,
        keep: int = HISTORY,
    ) -> None:
        self.job = job
        self.stats = JobStats()
        self.leases = None if job.every_instance else leases
        """Keeps the leases of claimed runs; None: every instance runs every tick."""
        self.store = None if self.leases is None else self.leases.store
        """Where ticks are claimed (the keeper's store), or None."""
        self._clock = clock
        self._parent_logger = logger
        self._logger: logging.Logger | None = None
        self._claims: Claims | None = None
        self._tasks: Spawning | None = None
        self._serving = False  # its task is made (and has not ended)
        self._handle: TaskHandle | None = None  # its task, while it serves
        self._gate: Gate | None = None  # what the parked task waits on
        self.thread_done: threading.Event | None = None  # set when the sync job's thread returns
        schedule = job.schedule
        # Interval jobs step on their grid by integer microseconds; others (and
        # subclasses, which may move their ticks) ask the schedule.
        self.period_us = schedule.period_us if type(schedule) in _GRIDS else 0  # type: ignore[attr-defined]
        self.grid_us = 0
        self.retired = False
        """Replaced by a runner of the job's changed schedule (made at run time),
        which took over its stats: it ends after its run in flight."""
        # Set by the dispatcher:
        self.stopping = False
        self.in_flight = False
        """The dispatcher has taken a tick for this job (claiming, woken or running)."""
        self.woken = False
        self.due = 0.0
        """The tick of the run the dispatcher wakes the job for."""
        self.fence: int | None = None
        self.claimed_at, self.grouped = 0.0, False  # grouped: see `arm`
        self.manual: Manual | None = None
        """The run asked for by hand that the task is woken for, if it is one."""
        self.queued: float | None = None
        """A tick that came during the run in flight, kept to run after it (`keep`)."""
        self.replaced_by: float | None = None
        """The tick that cancelled the run in flight (``overlap="replace"``)."""
        self._scope: anyio.CancelScope | None = None  # a replaceable run's
        self.paused_until = job.declared_pause
        """Ticks before this instant are skipped as paused (inf: until resumed)."""
        self.pause_unknown = False
        """The store's pauses are not read yet (an every_instance job, which no
        claim guards): its ticks are skipped (``paused_until`` is inf meanwhile)."""
        self.observers: Observers | None = None
        """Told about runs and skips; None (not an empty one) when there are none."""
        # Made on the first run; claimed runs are in the store's history instead.
        self.history: History | None = None
        self._keep = keep
        self._retry_wait: anyio.CancelScope | None = None
        self._catch_up: float | None = None  # the missed tick announced at start
        self._lease: Lease | None = None  # the claimed run's, while it goes

    @property
    def logger(self) -> logging.Logger:
        """``<scheduler logger>.<job name>``; made on first use (a logger per job
        is a lasting entry in logging's registry)."""
        if self._logger is None:
            self._logger = self._parent_logger.getChild(self.job.name)
        return self._logger

    def arm(self, claims: Claims | None, tasks: Spawning) -> None:
        """Make ready to serve (a scheduler can be started more than once)."""
        self._claims, self._tasks = claims, tasks
        job = self.job
        if claims is not None and self.leases is not None and job.overlap == "replace":
            claims.replacing.add(job.name)
        if claims is not None and self.leases is not None and job.enqueue is not None:
            claims.handing_off.add(job.name)
        # Claimed with the set of jobs due at the same instant (``_core.claims``'s
        # `instant`): a job claimed by tick, whose ticks never wait for a run
        # (overlap "skip"), and that hands nothing off (the losers of its claim
        # watch the tick, in case its claimer dies before handing it off).
        self.grouped = (
            claims is not None
            and self.leases is not None
            and job.overlap == "skip"
            and job.enqueue is None
        )
        self.stopping = self.in_flight = self.woken = self._serving = False
        self.fence = self._catch_up = self.queued = self.replaced_by = None

    def place(self, tick: float) -> None:
        """The job is due at ``tick``: `advance` steps on from there."""
        if self.period_us:
            self.grid_us = round(self.job.schedule.next_after(tick) * _US) - self.period_us

    def advance(self, tick: float) -> float:
        """The job's next tick after ``tick``, the instant it was due at."""
        period = self.period_us
        if period:
            self.grid_us = grid = self.grid_us + period
            return grid / _US
        return self.job.schedule.next_after(tick)

    def schedule_failed(self, exc: Exception) -> None:
        """The job's schedule raised: the job stops ticking (the others go on)."""
        self.stats.next_run_at = None
        self.logger.error(
            "job %r: its schedule failed (%r); the job stops ticking until the app restarts",
            self.job.name,
            exc,
            exc_info=exc,
            extra={"job": self.job.name},
        )

    def skip_missed(self, tick: float, now: float) -> tuple[float, float]:
        """Late at ``now`` for ``tick``: count the ticks missed; the latest due
        tick (to run) and the one after it."""
        schedule = self.job.schedule
        missed, latest = schedule.ticks_between(tick, now)
        if tick == self._catch_up:
            # The catch-up announced at start runs as announced, although the
            # next tick came due before the loop got to it (a stall right
            # after the announcement); the ticks due since count as missed.
            self._catch_up = None
            self.skipped("missed", schedule.next_after(tick), missed)
            self.place(latest)
            return tick, self.advance(latest)
        self.skipped("missed", tick, missed)
        self.place(latest)
        return latest, self.advance(latest)

    def skipped(self, reason: SkipReason, tick: float | None, count: int = 1) -> None:
        """``count`` ticks (from ``tick``) did not run here, for ``reason``."""
        if count <= 0:
            return
        self.stats.skip(reason, count)
        if self.observers is not None:
            self.observers.skipped(self.job.name, tick, reason, count)

    def keep(self, tick: float) -> bool:
        """``tick`` came while the job is busy: keep it to run after the run in
        flight, as the job's ``overlap`` says; False if it is dropped. Only a run
        that goes in the job's task is followed (not a claim on its way, nor a
        thread left running after its run was cut)."""
        if not self.stats.running or self.stopping or self._handle is None:
            return False
        if self.job.overlap == "queue_one":
            if self.queued is not None:
                return False  # one is kept already
            self.queued = tick
            return True
        if self.queued is not None:  # replace: the newest tick replaces a kept one too
            self.skipped("overlap", self.queued)
        self.queued = tick
        if self.replaced_by is None and self._scope is not None:
            self.replaced_by = tick
            self._scope.cancel()
        return True

    def drop_kept(self) -> None:
        """The tick kept for after the run will not run (the app stops): counted."""
        if self.queued is not None:
            self.skipped("overlap", self.queued)
            self.queued = self.replaced_by = None

    def wake(self) -> None:
        """Run the job for `due` (with `fence` if claimed). Once
        stopping, only a tick claimed before the stop runs (it is this instance's
        to run), and only while the job's task still serves."""
        if self.stopping and (self.fence is None or not self._serving):
            self.settle()
            return
        self.woken = True
        gate = self._gate
        if gate is not None:
            self._gate = None
            gate.set_result(None)
        elif not self._serving:
            # First due: the job gets its task now (it sees `woken` and runs).
            self._serving = True
            assert self._tasks is not None
            self._tasks.spawn(self)

    def settle(self, *, cancel: bool = True) -> None:
        """The tick taken for this job will not run here: free the job again
        (and release the claim made for it, if any); if stopping, end its task
        (unless ``cancel`` is false: the task itself is ending)."""
        self.in_flight = self.woken = False
        manual = self.manual
        if manual is not None:
            self.manual = None
            manual.done.set()  # never ran: its ran stays None
        fence = self.fence
        if fence is not None:
            self.fence = None
            assert self._claims is not None
            # Never ran, so no run is recorded: this line is the claim's only trace.
            self.logger.info(
                "job %r: tick %s (fence %d) was claimed as the app stopped; released "
                "without running",
                self.job.name,
                datetime.fromtimestamp(self.due, UTC).isoformat(),
                fence,
                extra={"job": self.job.name},
            )
            self._claims.release_soon(Ended(self.job.name, fence, None, None, 0.0, 0))
        if cancel and self.stopping and self._handle is not None:
            self._handle.cancel()

    @property
    def busy(self) -> bool:
        """A run is taken or going, or the thread of an earlier one has not returned."""
        done = self.thread_done
        return self.in_flight or self.stats.running or (done is not None and not done.is_set())

    @property
    def thread_running(self) -> bool:
        """A thread of this job runs on after its run was cut or abandoned."""
        done = self.thread_done
        return not self.stats.running and done is not None and not done.is_set()
