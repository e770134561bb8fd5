"""What the scheduler needs of a store: claims per (job, tick), leases, history.

The scheduler only talks to this protocol; `fastapi_jobs.stores` has the
implementation on SQLAlchemy (PostgreSQL, SQLite).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from ._clock import Clock
from ._errors import ConfigurationError, NameTakenError, TooManySchedulesError, short
from ._results import Ended
from ._status import ClusterView, RunRecord
from .queues import Outbox

__all__ = [
    "FUTURE_MARGIN",
    "REPLACED_BY",
    "Capabilities",
    "Ended",
    "Instance",
    "PastTicks",
    "Refused",
    "ScheduleRow",
    "ScheduleTable",
    "SetChange",
    "Store",
]


FUTURE_MARGIN = 1.0
"""How far ahead of the database's clock a store claims a tick (seconds).
Healthy hosts claim at or after the tick; this absorbs timers that fire a hair
early and the error of the clock's offset. Past it: `TickAheadError`."""
REPLACED_BY = "RunReplacedError: replaced by the newer tick claimed by "
"""The recorded error of a run an ``overlap="replace"`` claim took over, before
the claimer's id."""


@dataclass(frozen=True, slots=True)
class Instance:
    """This process, as the store knows it."""

    hostname: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            # Host and pid for people; a random suffix because pids are reused.
            object.__setattr__(self, "id", f"{self.hostname}:{self.pid}:{secrets.token_hex(3)}")


@runtime_checkable
class Store(Protocol):
    """Claims and run history shared by every instance of the app.

    The scheduler bounds every call with ``timeout`` (a pause or a resume with
    three times that: see `pause`) and cancels it at
    shutdown; an implementation must come out of that whole: a cancelled
    call may not leave a connection broken or a task behind (the SQLAlchemy
    store runs each operation in a task of its own that callers only wait
    for). A claim made although its caller gave up must not hold the job.

    Optional: ``release_then_claim(ended, wanted, **options)``, the `release` of
    ``ended`` and then the `claim` of ``wanted`` (``options`` as `claim`'s) in one
    call, returning ``(refused releases, fences)``. Where a store has it, the
    scheduler sends the releases it has gathered with its next claim, in one call.

    Optional: ``instant_claims = True``, and then `claim` (and
    ``release_then_claim``) take ``instant=(key, at, jobs)``: ``jobs`` (of
    ``wanted``, each for the tick ``at``) are the set of jobs due together at
    ``at`` that ``key`` names (the same on every instance with the same set);
    their claims are made only if no instance claimed ``at``, or a later
    instant, for ``key`` (under the same conditions as a claim: not ahead of the
    database's clock, not after the caller gave up), else they are left out of
    the answer, as if held elsewhere. The others of ``wanted`` are claimed as
    usual. The instant's claim only saves work: each job's own claim decides.

    Optional: ``read_jobs(jobs, unwell=False)``, `read` with the claims of
    ``jobs`` only (others may come too), and with ``unwell`` also every claim
    whose last run failed or timed out, or whose lease is live: where a store
    has it, the status page and a listing's page read the claims of the jobs
    they show, and a filter on failing or running those that can be.

    Optional too: ``schedules`` (a `ScheduleTable`: schedules made at run
    time), ``backfills`` (`PastTicks`: `Scheduler.backfill`) and ``outbox``
    (`fastapi_jobs.queues.Outbox`: hand-offs recorded), and
    ``follow_clock(clock)``, which a store that keeps time by the scheduler's
    clock, not a server's (`fastapi_jobs.testing.MemoryStore`), is given the
    scheduler's clock with, when it is built. The scheduler reads
    what a store has once, when it is built (`Capabilities`), and refuses one
    that offers a capability with a method missing, naming the method.
    """

    lease: float
    """Seconds a claim is held without renewal before a peer may take over."""
    timeout: float
    """Seconds any one store operation may take before it counts as failed."""
    heartbeat: float
    """Seconds between two beats of this instance's row."""

    async def open(self, state: Mapping[str, Any], instance: Instance) -> None:
        """Get ready for this instance; must not fail when the database is down."""

    async def close(self) -> None:
        """Forget this instance (graceful stop) and free what open() took."""

    async def claim(
        self,
        wanted: Sequence[tuple[str, float]],
        *,
        manual: bool = False,
        versions: Mapping[str, int] | None = None,
        replace: Collection[str] = (),
        handoffs: Collection[str] = (),
    ) -> Mapping[str, int | Exception]:
        """Claim each ``(job, tick)``, all in one go (the scheduler asks once per
        instant for every job due then). A job paused in the store is not
        claimed, unless ``manual`` (an operator asked for the run).

        ``versions`` (passed only while this instance runs schedules made at run
        time, and only to a store that has ``schedules``): the version of each
        such schedule this instance runs, by name; its tick is not claimed
        unless the store's schedule of that name has that version (changed or
        removed elsewhere: not claimed), and a job not listed is not claimed
        while the store has a live schedule of its name.

        ``replace`` (passed only when some of ``wanted`` are such jobs, never with
        ``manual``): jobs whose ``overlap`` is ``"replace"``; their claim takes over
        a lease still held (its holder's renewal then fails, and its run is
        cancelled), and the run it replaces is recorded in the history as
        cancelled.

        ``handoffs`` (passed only when some of ``wanted`` are such jobs, never with
        ``manual``): the hand-off jobs; their claim takes a job's row only once
        its last claim was released, never because that claim's lease is over:
        a claim made and never released (its claimer died, perhaps before its
        enqueue) is `reclaim`'s, for that very tick, so that no later tick
        moves the row past a tick nobody enqueued.

        Returns, by job, the new fence of each claim made; a job that is missing
        is held elsewhere (or its tick is not newer than its last); an exception
        is that job's own failure (a value the database refused), while the
        others went through. A `TickAheadError` says the tick is still in the
        future on the database's clock (and what that clock read): the
        scheduler takes the reading and claims the tick again when it is due;
        a store that cannot tell leaves the job missing. A
        `ScheduleChangedError` says a stored schedule's tick was asked under a
        version (``versions``) its row no longer has: the scheduler reads the
        change at once; a store that cannot tell leaves the job missing (the
        tick is then counted as claimed elsewhere). Raises when the store
        cannot be reached at all.
        """

    async def reclaim(
        self, wanted: Sequence[tuple[str, float]]
    ) -> Mapping[str, int | tuple[float, float] | Exception]:
        """Claim again each ``(job, tick)`` whose claim of that very tick was made
        and never released, and whose lease is over (its claimer died): the
        hand-off jobs' ticks, whose enqueue is keyed by the tick (never an
        in-process run's). Paused jobs are not claimed.

        Returns, by job, the new fence of each claim made; for a job not claimed
        again whose row is still claimed and unreleased, ``(tick, lease_left)``:
        the tick its claim holds and the seconds left on its lease (negative:
        over); a job missing is released (or unknown). Exceptions as `claim`.
        A re-claim made although its caller gave up is not freed (a freed row
        looks released, and its tick would never be claimed again): its lease
        runs out, and the tick is claimed again after it.
        """

    async def renew(self, job: str, fence: int) -> bool:
        """Extend the lease of the claim ``fence``; False if it is not ours any more."""

    async def release(self, ended: Sequence[Ended]) -> Mapping[str, Exception]:
        """Record how the runs of these claims ended (and in the run history, in
        the same round trip) and free their leases.

        Returns the failures of single rows, by job (the others went through);
        raises when the store cannot be reached at all. Releasing a claim that is
        no longer the job's latest changes nothing.
        """

    async def last_tick(self, job: str) -> float | None:
        """The last tick claimed for ``job`` by any instance, if any."""

    async def beat(self) -> float:
        """Tell the store this instance is alive; return the database's time."""

    async def read(self) -> ClusterView:
        """The cluster-wide view for the status page, with the pauses and their
        versions as `pauses` gives them."""

    async def pause(self, job: str, until: float | None) -> int:
        """Pause ``job`` for every instance until ``until`` (None: until resumed);
        return the version of the job's pause that this change made (see
        `pauses`).

        The scheduler waits up to three times ``timeout`` for the answer, and
        tells its caller what became of the change: raise `StoreError`
        only when the change was not made (the database refused it, or it came
        too late to be made); any other error says it may have been made."""

    async def resume(self, job: str) -> int:
        """Resume ``job`` for every instance (also a job declared paused); the
        version, and the errors, as `pause`."""

    async def pauses(self) -> Mapping[str, tuple[float, int]]:
        """Each job an operator paused or resumed: ``(until, version)``, paused
        until this instant (``math.inf``: until resumed; 0 or a past instant: not
        paused), and the version of that pause, which grows with each change of
        the job's pause (and never goes back, even for a table made again). A
        reading is applied only where its version is newer than the one this
        process has, so that a slow reading cannot undo a newer change. A job
        not listed keeps its declared default."""

    async def runs(self, job: str, limit: int) -> list[RunRecord]:
        """The last ``limit`` runs of ``job`` across instances, newest first."""

    async def recent_runs(self, jobs: Sequence[str], limit: int) -> Mapping[str, list[RunRecord]]:
        """`runs` of each of ``jobs`` (the status page's charts), in one go."""

    async def prune(self) -> None:
        """Apply the run history's retention (the scheduler calls it now and then)."""


# -- what a store may have beyond the protocol ------------------------------


class ScheduleRow(NamedTuple):
    """A row of the store's schedules table, as the scheduler reads it."""

    name: str
    task: str
    spec: str
    """`encode`'s JSON."""
    version: int
    updated_at: float
    removed: bool
    group: str | None = None
    """The set it was applied with (`ScheduleTable.apply`); None: made one by one."""


class AppliedRows(NamedTuple):
    """What `ScheduleTable.apply` wrote: the rows created, changed and removed
    (as written, in that order), and how many were left as they were."""

    created: list[ScheduleRow]
    changed: list[ScheduleRow]
    removed: list[ScheduleRow]
    unchanged: int


class SetChange(NamedTuple):
    """What applying a set does to a group's live schedules (name: task, spec):
    the names to make, to change (their task or spec differs) and to remove.
    One computation for every place a set is applied (the SQL store, the memory
    store, a scheduler without a store)."""

    new: list[str]
    changed: list[str]
    gone: list[str]

    @classmethod
    def of(
        cls, current: Mapping[str, tuple[str, str]], wanted: Mapping[str, tuple[str, str]]
    ) -> SetChange:
        return cls(
            new=[name for name in wanted if name not in current],
            changed=[name for name in wanted if name in current and current[name] != wanted[name]],
            gone=[name for name in current if name not in wanted],
        )

    @property
    def grows_by(self) -> int:
        return len(self.new) - len(self.gone)

    def check_bound(self, live: int, most: int | None) -> None:
        """`TooManySchedulesError` if the set takes ``live`` schedules past ``most``."""
        if most is not None and self.grows_by > 0 and live + self.grows_by > most:
            raise TooManySchedulesError(live, self.grows_by, most)

    @staticmethod
    def taken(group: str, names: Sequence[str]) -> NameTakenError:
        """The error of a set some of whose ``names`` live outside ``group``."""
        if len(names) == 1:
            return NameTakenError(
                f"the name {names[0]!r} is taken by a live schedule outside group {group!r}: "
                "remove that schedule, or leave the name out; nothing was applied"
            )
        listed = ", ".join(repr(n) for n in names[:5]) + (", ..." if len(names) > 5 else "")
        return NameTakenError(
            f"{len(names)} of the names are taken by live schedules outside group {group!r} "
            f"({listed}): remove those schedules, or leave the names out; nothing was applied"
        )


@runtime_checkable
class ScheduleTable(Protocol):
    """What a store keeps schedules in (``SQLAlchemyStore.schedules``). Each
    write is made within the store's timeout or not at all (`StoreError`), as a
    pause is (`Store.pause`), and returns the row as written."""

    async def create(
        self, name: str, task: str, spec: str, most: int | None = None
    ) -> ScheduleRow | None:
        """Insert; None if a live schedule has the name. `TooManySchedulesError`
        if ``most`` live schedules exist already (nothing written)."""

    async def change(self, name: str, task: str, spec: str, expect: int) -> ScheduleRow | None:
        """Replace the spec of the live schedule ``name`` whose version is still
        ``expect``; None if there is none (removed, or changed meanwhile)."""

    async def get(self, name: str) -> ScheduleRow | None:
        """The live schedule ``name``, if there is one."""

    async def remove(self, name: str) -> ScheduleRow | None:
        """Mark removed (a row left, so that every instance reads the removal);
        None if no live schedule has the name."""

    async def changes(self, since: int) -> list[ScheduleRow]:
        """The rows changed at or after version ``since``, removals included
        (``since`` 0: every live row)."""

    async def apply(
        self,
        group: str,
        rows: Mapping[str, tuple[str, str]],
        most: int | None,
        within: float,
    ) -> AppliedRows:
        """Make the live schedules of ``group`` exactly ``rows`` (name: task,
        spec), in one transaction made within ``within`` seconds or not at all:
        rows created, changed where the task or spec differs (version bumped),
        removed where not given; the others untouched. `NameTakenError` if a
        live schedule outside the group has one of the names, and
        `TooManySchedulesError` past ``most`` live schedules: nothing written."""


Refused = Literal["ran", "held", "changed"]
"""Why a past tick was not claimed: ``ran``, the history has a run of it (or
it is the job's last tick claimed: ran, running, or given back unrun);
``held``, the job's lease is held (a run going, here or elsewhere);
``changed``, the stored schedule is not the version the backfill runs (changed
or removed on some instance), or a declared job's name is a stored schedule's."""


@runtime_checkable
class PastTicks(Protocol):
    """What a store claims past ticks with (``SQLAlchemyStore.backfills``):
    `Scheduler.backfill` needs it."""

    async def claim(self, job: str, tick: float, version: int | None = None) -> int | Refused:
        """Claim ``job``'s past ``tick``: its fence, or why not. ``version``:
        the stored schedule's the backfill runs (None: a declared job). Made
        within the store's ``timeout`` or given up (`TimeoutError`)."""


_Both = Callable[..., Awaitable[tuple[Mapping[str, Exception], Mapping[str, int | Exception]]]]


class Capabilities(NamedTuple):
    """What a store can do beyond `Store`, each read once, when the scheduler
    is built (`of`): every part of the scheduler asks here, not the store.

    A store has a capability by having its attribute: ``schedules`` (a
    `ScheduleTable`: schedules made at run time, shared by the instances),
    ``backfills`` (`PastTicks`), ``outbox`` (`fastapi_jobs.queues.Outbox`: a
    record of hand-offs), ``instant_claims = True`` and
    ``release_then_claim`` (see `Store`); ``follow_clock(clock)``, a store
    that keeps time by the scheduler's clock (`fastapi_jobs.testing.MemoryStore`,
    in virtual time), is given the scheduler's when it is built. One that has
    the attribute but not all of its methods is refused, by name, when the
    scheduler is built."""

    schedules: ScheduleTable | None = None
    backfills: PastTicks | None = None
    outbox: Outbox | None = None
    instant_claims: bool = False
    release_then_claim: _Both | None = None
    follow_clock: Callable[[Clock], None] | None = None
    read_jobs: Callable[[Collection[str], bool], Awaitable[ClusterView]] | None = None

    @classmethod
    def of(cls, store: Store | None) -> Capabilities:
        """``store``'s capabilities; `ConfigurationError` naming what a
        capability it offers lacks."""
        if store is None:
            return cls()
        named = {"schedules": ScheduleTable, "backfills": PastTicks, "outbox": Outbox}
        found: dict[str, Any] = {}
        for name, protocol in named.items():
            part = getattr(store, name, None)
            if part is not None:
                _check(store, name, part, protocol)
            found[name] = part
        methods = {
            name: getattr(store, name, None)
            for name in ("release_then_claim", "follow_clock", "read_jobs")
        }
        for name, method in methods.items():
            if method is not None and not callable(method):
                raise ConfigurationError(
                    f"{short(store)}.{name} is not a method: remove it, or see Store"
                )
        return cls(
            **found, instant_claims=getattr(store, "instant_claims", False) is True, **methods
        )


def missing(part: object, protocol: type) -> list[str]:
    """The methods and attributes of ``protocol`` that ``part`` lacks."""
    wanted = [
        name
        for name in (*vars(protocol), *getattr(protocol, "__annotations__", {}))
        if not name.startswith("_")
    ]
    return sorted({name for name in wanted if not hasattr(part, name)})


def _check(store: object, name: str, part: object, protocol: type) -> None:
    lacks = missing(part, protocol)
    if lacks:
        raise ConfigurationError(
            f"the store's {name} ({short(part)}) lacks {', '.join(lacks)}: a "
            f"{protocol.__name__} has them (see fastapi_jobs.stores.Store); give the "
            f"store all of them, or no `{name}`"
        )
