"""Status: plain data about each job, kept by its loop and read by the router.

The loop writes a few floats and ints per run into `JobStats` (cheap on
the hot path), through `JobStats.ended` for how each run ended;
`JobStatus` is the read-only snapshot built on demand. How a run can end
(``Outcome``, ``SkipReason``) is defined in ``_results``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from ._clock import as_datetime
from ._redaction import MAX_MESSAGE, error_line, error_shown
from ._results import Outcome, SkipReason

__all__ = [
    "FILTER_STATES",
    "ClusterJobStatus",
    "ClusterView",
    "ErrorInfo",
    "Health",
    "InstanceStatus",
    "JobStats",
    "JobStatus",
    "Outcome",
    "PauseState",
    "RunRecord",
    "SchedulerState",
    "SkipReason",
    "pause_end",
    "state_word",
    "utc",
]


class ErrorInfo(BaseModel):
    """The last error of a job: its type and a short message, never a traceback."""

    type: str = Field(description="The exception's class name, e.g. 'ValueError'.")
    message: str = Field(
        description="The first line of str() of the exception, without SQL or "
        f"parameters, at most {MAX_MESSAGE} characters; the log has the rest."
    )

    @classmethod
    def of(cls, error: BaseException) -> ErrorInfo:
        """What of ``error`` may be shown (`fastapi_jobs._redaction.error_shown`)."""
        kind, message = error_shown(error)
        return cls(type=kind, message=message)

    def __str__(self) -> str:
        return error_line(self.type, self.message)

    @classmethod
    def parse(cls, text: str | None) -> ErrorInfo | None:
        """Back from `__str__` (how the store keeps it)."""
        if text is None:
            return None
        kind, _, message = text.partition(": ")
        return cls(type=kind, message=message)


class RunRecord(BaseModel):
    """One tick's run (retries included), as ``GET /jobs/{name}/runs`` lists it."""

    id: str = Field(
        description="With a store, the claim's fence (unique per job across instances); "
        "else 'instance#n', unique in this process."
    )
    job: str
    tick: datetime | None = Field(description="The tick run (for a manual run, when it was asked).")
    manual: bool = Field(description="Asked for by hand (trigger, run_now, the CLI).")
    attempts: int = Field(description="Runs it took: 1, plus the retries.")
    started_at: datetime | None = Field(
        description="With a store: when its claim reached the database (its clock)."
    )
    finished_at: datetime | None = Field(
        description="With a store: when its release reached the database (its clock)."
    )
    duration_s: float | None = Field(
        description="From its first try's start to its last try's end, as the run measured it."
    )
    outcome: Outcome | None
    error: ErrorInfo | None
    instance: str = Field(description="The instance that ran it.")
    fence: int | None = Field(description="The claim's fence, with a store.")
    queue_id: str | None = Field(
        default=None,
        description="A hand-off job's run that went through: the queue's job id of its "
        "tick (the key 'job@tick' for arq and Celery, procrastinate's job id).",
    )


class PauseState(BaseModel):
    """A job's pause, as the control endpoints answer it."""

    job: str
    paused: bool
    until: datetime | None = Field(description="The end of the pause, if it has one.")
    scope: Literal["cluster", "process"] = Field(
        description="'cluster': kept in the store, for every instance and across restarts; "
        "'process': no store, so this process only, until it restarts."
    )


SchedulerState = Literal["running", "never_started", "stopped"]
"""Whether a scheduler runs: ``never_started``, the app never ran its lifespan;
``stopped``, it ran and stopped (the app is shutting down)."""


class Health(BaseModel):
    """Whether this instance's scheduler does its work: what `Scheduler.health`
    returns, and what the health route answers (HTTP 200 when ``ok``, else 503)."""

    ok: bool = Field(description="The scheduler runs, and its store answers (if it has one).")
    status: Literal["ok", "store_failing", "not_running"] = Field(
        description="'ok'; 'store_failing': every claim or every heartbeat has failed for "
        "longer than the store's lease (at once for a configuration the store refuses), "
        "so no claimed job runs here; 'not_running': the scheduler is not running (the app "
        "has not started it, or is stopping)."
    )
    detail: str = Field(description="What is wrong and where to look, in one sentence.")
    scheduler: SchedulerState = Field(
        default="running",
        description="Whether the scheduler runs: 'never_started' (write "
        "FastAPI(lifespan=scheduler.lifespan)) or 'stopped' (the app is shutting down) "
        "are 'not_running'.",
    )
    store_failing_for_s: float | None = Field(
        default=None,
        description="How long the store's calls have failed, once that is too long; null "
        "while it answers (or with no store).",
    )
    lease_s: float | None = Field(
        default=None,
        description="The store's lease, the threshold of 'store_failing'; null with no store.",
    )


class ClusterJobStatus(BaseModel):
    """A job's last claimed run across every instance sharing the store."""

    last_tick: datetime | None = Field(description="The latest tick claimed by any instance.")
    fence: int = Field(description="Grows by one with each claim of this job.")
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_duration_s: float | None
    last_outcome: Outcome | None
    last_error: ErrorInfo | None = Field(
        description="The error of the last run, if it failed (as the top-level `last_error`)."
    )
    last_success_at: datetime | None = Field(
        default=None,
        description="When its latest successful run ended (database clock); null if none "
        "is on record (never succeeded, or older than the run history the store keeps).",
    )
    last_instance: str = Field(description="The instance that claimed the last tick.")
    running_on: str | None = Field(
        description="The instance holding a live lease on this job now, if any."
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="Runs of this job on every instance sharing the store, since its first "
        "claim: each claim is one (a tick, a run by hand, a backfilled tick), so this is "
        "`fence`. The top-level `runs` are the answering process's own."
    )
    @property
    def runs(self) -> int:
        # Every claim moves the fence by one, from 1: the store keeps the
        # cluster's count already, and a page reads it with the claim.
        return self.fence


class InstanceStatus(BaseModel):
    """An app instance (process) that shares the store."""

    id: str
    hostname: str
    pid: int
    started_at: datetime
    seen_at: datetime = Field(description="Its last heartbeat, on the database's clock.")


class ClusterView(BaseModel):
    """What a store knows: each job's last claimed run, and the live instances."""

    jobs: dict[str, ClusterJobStatus]
    instances: list[InstanceStatus]
    pauses: dict[str, float] = Field(
        default_factory=dict,
        exclude=True,
        description="As Store.pauses(): paused until (inf: until resumed; 0: resumed).",
    )
    pause_versions: dict[str, int] = Field(
        default_factory=dict,
        exclude=True,
        description="The version of each pause in `pauses`, as Store.pauses() gives it.",
    )
    read_at: float | None = Field(
        default=None, exclude=True, description="When it was read, on the database's clock."
    )


class JobStatus(BaseModel):
    """One job's status, as ``GET /jobs`` returns it."""

    name: str
    instance: str = Field(
        description="The process that answered (host:pid:random). Every figure here but "
        "`cluster` is this process's own: with several workers, each has its own counts."
    )
    schedule: str = Field(description="Human-readable schedule.")
    running: bool = Field(description="A run of this job is going now.")
    next_run_at: datetime | None = Field(
        description="The next tick (UTC); null when the scheduler is not running (see `scheduler`)."
    )
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_duration_s: float | None
    last_outcome: Outcome | None
    last_error: ErrorInfo | None = Field(
        description="The error of the latest failed or timed-out run, kept after successes."
    )
    runs: int = Field(description="Runs started in this process since it started.")
    failures: int = Field(description="Runs in this process that failed or timed out.")
    skipped_ticks: int = Field(description="Ticks that did not run in this process.")
    skipped: dict[str, int] = Field(description="This process's skipped ticks by reason.")
    claims: bool = Field(
        description="Ticks are claimed in the store, so each runs on one instance only."
    )
    paused: bool = Field(default=False, description="Ticks are skipped (`skipped.paused`).")
    paused_until: datetime | None = Field(
        default=None, description="When a pause with an end ends; null: until resumed."
    )
    retries: int = Field(default=0, description="Retries run in this process.")
    hand_off: str | None = Field(
        default=None,
        description="A hand-off job's queue (e.g. `arq task send_digest`): each run "
        "enqueues a task there; null: the job runs its work itself.",
    )
    task: str | None = Field(
        default=None,
        description="A schedule made at run time (`add_schedule`): the task it runs; "
        "null: a job declared in code.",
    )
    overlap: str = Field(
        default="skip",
        description="What a tick that comes during a run does: skip, queue_one or replace.",
    )
    jitter: float | None = Field(
        default=None,
        description="The bound of the fixed offset of this job's ticks, in seconds "
        "(`next_run_at` includes the offset); null: none.",
    )
    cluster: ClusterJobStatus | None = Field(
        default=None,
        description="With a store: the last run of this job across all instances.",
    )
    scheduler: SchedulerState = Field(
        default="running",
        description="Whether the scheduler runs. 'never_started': the app never ran its "
        "lifespan, so no job runs: write FastAPI(lifespan=scheduler.lifespan). 'stopped': "
        "it ran and has stopped (the app is shutting down).",
    )


def utc(ts: float | None) -> datetime | None:
    """``ts`` as an aware UTC datetime; None for None, and for an instant no
    datetime can hold (a custom schedule's far future must not break status)."""
    if ts is None:
        return None
    try:
        return as_datetime(ts)
    except (OverflowError, OSError, ValueError):
        return None


FILTER_STATES = ("failing", "paused", "running", "left_alone")
"""What a listing's state filter takes: three words of `state_word`, and
``left_alone``, the stored schedules an instance cannot run."""


def state_word(paused: bool, running: bool, outcome: Outcome | None) -> str:
    """A job's state in one word, as the status page's State column says it and
    the listings' ``state=`` filters it: paused first, then running, then how
    its last run ended (failing for failed or timed out, never ran, cancelled, ok)."""
    if paused:
        return "paused"
    if running:
        return "running"
    if outcome is None:
        return "never ran"
    if outcome in ("failed", "timed_out"):
        return "failing"
    return "cancelled" if outcome == "cancelled" else "ok"


def pause_end(paused_until: float, now: float) -> datetime | None:
    """When a pause in force at ``now`` ends; None if none is, or it lasts until
    resumed."""
    return utc(paused_until) if now < paused_until < math.inf else None


class JobStats:
    """Mutable counters of one job in this process."""

    __slots__ = (
        "cancelled",
        "failures",
        "last_duration",
        "last_error",
        "last_finished_at",
        "last_ok_at",
        "last_outcome",
        "last_started_at",
        "next_run_at",
        "ok",
        "retries",
        "running",
        "runs",
        "skipped",
        "timeouts",
    )

    def __init__(self) -> None:
        self.running = False
        self.runs = 0
        """Runs (attempts) started; each that ended is counted once, by its
        outcome, in exactly one of ``ok``, ``failures`` (``timeouts`` of them
        timed out) and ``cancelled``."""
        self.retries = 0
        self.ok = 0
        self.failures = 0
        """Runs that failed or timed out (``timeouts`` of them timed out)."""
        self.timeouts = 0
        self.cancelled = 0
        """Runs cut from outside: by shutdown, or by a lost lease."""
        self.next_run_at: float | None = None
        self.last_started_at: float | None = None
        self.last_finished_at: float | None = None
        self.last_ok_at: float | None = None
        self.last_duration: float | None = None
        self.last_outcome: Outcome | None = None
        self.last_error: ErrorInfo | None = None
        """As the status shows it: the exception itself would keep its
        traceback's frames (and the job's locals) alive until the next error."""
        self.skipped: dict[str, int] | None = None  # made on the first skip: most jobs never skip

    def ended(
        self, outcome: Outcome, error: BaseException | None, finished: float, duration: float
    ) -> None:
        """A run ended as ``outcome``: the one writer of the per-outcome counts
        (the guarded run inlines the ``ok`` branch: the hot path). ``error``: a
        failed run's exception, a timed-out one's ``TimeoutError``, a run cut by
        a lost lease its ``LeaseLostError`` (None for one cut by shutdown: the
        previous error stays visible)."""
        self.running = False
        self.last_finished_at = finished
        self.last_duration = duration
        self.last_outcome = outcome
        if outcome == "ok":
            self.ok += 1
            self.last_ok_at = finished
            return
        if outcome == "cancelled":
            self.cancelled += 1
        else:
            self.failures += 1
            if outcome == "timed_out":
                self.timeouts += 1
        if error is not None:
            self.last_error = ErrorInfo.of(error)

    def skip(self, reason: SkipReason, count: int = 1) -> None:
        if self.skipped is None:
            self.skipped = {}
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def snapshot(
        self,
        name: str,
        instance: str,
        schedule: str,
        claims: bool,
        running: bool,
        paused_until: float,
        now: float,
        hand_off: str | None = None,
        task: str | None = None,
        policies: tuple[str, float | None] = ("skip", None),
        scheduler: SchedulerState = "running",
    ) -> JobStatus:
        return JobStatus(
            name=name,
            instance=instance,
            schedule=schedule,
            running=running,
            next_run_at=utc(self.next_run_at),
            last_started_at=utc(self.last_started_at),
            last_finished_at=utc(self.last_finished_at),
            last_duration_s=self.last_duration,
            last_outcome=self.last_outcome,
            last_error=self.last_error,
            runs=self.runs,
            failures=self.failures,
            skipped_ticks=sum(self.skipped.values()) if self.skipped else 0,
            skipped=dict(self.skipped or {}),
            claims=claims,
            paused=paused_until > now,
            paused_until=pause_end(paused_until, now),
            retries=self.retries,
            hand_off=hand_off,
            task=task,
            overlap=policies[0],
            jitter=policies[1],
            scheduler=scheduler,
        )
