"""The scheduler's side of the store: claims per instant, releases in batches.

The dispatcher claims every job due at one instant in one call under one
deadline, so a job that loses its claim costs a dictionary lookup, not a scope,
a deadline and a round trip of its own. Runs that end together have their
releases gathered for a couple of milliseconds and sent in one call from one
task. A release that fails is kept and sent again before the next claim: until
the database has it, this instance's own lease keeps the job from being
claimed (or it frees itself when the lease runs out).

A claim goes to the database after this instance's release of the job's
previous run, never beside it: a run that ended just before its job's next
tick would otherwise have that tick refused by its own unreleased claim (the
release waits out its gathering, or a lock, while the claim overtakes it).

Releases still gathered when a claim goes (runs that ended just before the
next tick) go in the claim's own call, first (``release_then_claim``, where
the store has it): one connection and one deadline for both.

Jobs that come due together on every instance (the same names, the same
stored schedules' versions) form a set, named by a digest (`instant`): where
the store claims instants, only the instance that claims the set's instant
first sends the set's claims, and the others skip theirs. Every instance
would otherwise send a claim per job per tick, all but one of them in vain.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from functools import partial
from hashlib import blake2b
from typing import Any, TypeVar

import anyio

from .._errors import StoreError, TickAheadError, short
from .._store import FUTURE_MARGIN, Capabilities, Ended, Store
from .health import StoreHealth
from .heartbeat import Heartbeat

__all__ = ["Claims"]

_T = TypeVar("_T")
_Both = Callable[..., Awaitable[tuple[Mapping[str, Exception], Mapping[str, int | Exception]]]]

# Runs that end "together" end a few microseconds apart (each is its own task):
# the first release waits this long for the others to join its statement.
GATHER = 0.002
# A peer claims an instant when its clock reads it (its timer a hair early),
# and its clock reads the database's to within its offset's uncertainty, taken
# as this instance's own (one database, one network) for the peer's and for
# this instance's reading of when a release landed; plus this margin. A
# release that landed since may have come after the peer's claim.
PEER_EARLY = 0.05
# Landed releases older than this are dropped as more land: an instant's set is
# claimed within an interval of it (later, each job's own claim decides), and a
# minute covers a loop that woke that late; an app that never claims a set
# (fewer than GROUP_FROM jobs due together) keeps a minute's batches, no more.
LANDED_FOR = 60.0
# A warning names this many jobs, then counts the rest.
_NAMED = 5


def _names(jobs: Sequence[str]) -> str:
    named = ", ".join(short(job, 40) for job in jobs[:_NAMED])
    return named if len(jobs) <= _NAMED else f"{named} and {len(jobs) - _NAMED} more"


class Claims:
    """Claims the ticks of this instance's jobs; gathers and sends their releases."""

    def __init__(
        self,
        store: Store,
        logger: logging.Logger,
        versions: Mapping[str, int] | None = None,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.store = store
        self.logger = logger
        capabilities = capabilities or Capabilities.of(store)
        self._instants = capabilities.instant_claims
        self._both = capabilities.release_then_claim
        self.versions = {} if versions is None else versions
        """The schedules made at run time, by name, and the version of each this
        instance runs (kept current by ``_dynamic.book``): passed with every
        claim while there are any."""
        self.replacing: set[str] = set()
        """The jobs whose ``overlap`` is ``"replace"``: their claims take over a
        lease still held (``Store.claim``'s ``replace``)."""
        self.handing_off: set[str] = set()
        """The hand-off jobs: their claims take only a released row, an
        abandoned one being the peers' to claim again (``Store.claim``'s
        ``handoffs``)."""
        self.heartbeat: Heartbeat | None = None
        """This instance's heartbeat (set once it runs): a claim refused as ahead
        of the database's clock corrects its clock (`heard`)."""
        self.health: StoreHealth | None = None
        """Told whether each claim went through (set once it runs)."""
        self.changed: dict[str, float] = {}
        """The stored schedules whose latest tick was refused under the version
        this instance runs (`changed_under`), with that tick: the runner of the
        new version, once read, takes it (``_dynamic.jobs``)."""
        self._ended: list[Ended] = []  # gathered, not yet sent
        self._unreleased: dict[str, Ended] = {}  # sent, failed: sent again
        self._wanted: anyio.Event | None = None  # set when a release is gathered
        self._sending: set[str] = set()  # jobs whose release is on its way
        self._sent = anyio.Event()  # set (and replaced) as each sending ends
        # The batches of releases that landed, oldest first, each with when (the
        # scheduler's clock), kept while a peer may yet claim an instant before
        # them, where the store claims instants (`_without_unsettled`): a batch,
        # not a job, an entry (one a second for a thousand jobs of every second).
        self._landed: deque[tuple[float, list[str]]] = deque()

    def changed_under(self, job: str, tick: float) -> float | None:
        """``job``'s claim of ``tick`` was refused for its version: the store has
        another (changed, or removed). Kept for the runner of the new version,
        and the change read now, by an early heartbeat, not at the next one.
        Returns the older tick kept before it, if any (the change not read
        since): that one is the caller's to count, as only the latest runs late."""
        older = self.changed.get(job)
        self.changed[job] = tick
        if self.heartbeat is not None:
            self.heartbeat.soon()
        return older

    def reading(self) -> float:
        """The local clock's reading that the offset to the database's is
        measured against (0.0 without a heartbeat): taken before a claim is sent,
        for `heard`."""
        heartbeat = self.heartbeat
        return 0.0 if heartbeat is None else heartbeat.clock.local()

    def heard(self, refused: TickAheadError, sent: float, jobs: Sequence[str]) -> None:
        """The claims of ``jobs``, sent at ``sent`` (a `reading`), were refused:
        their ticks are still in the future on the database's clock, whose
        reading came with the refusal. This instance's clock takes it now, not
        at the next heartbeat (which would leave up to ``heartbeat`` seconds of
        ticks claimed too early, each refused and lost)."""
        self.logger.warning(
            "the database refused the claims of %s: their tick is %.1fs ahead of its "
            "clock (stepped back?); ticking on the database's time",
            _names(jobs),
            refused.tick - refused.db_time,
        )
        heartbeat = self.heartbeat
        # A store of one's own may say anything: only a finite reading that
        # agrees with the refusal (the tick ahead of it by more than the
        # claim's margin) moves our clock.
        db_time = refused.db_time
        if (
            heartbeat is not None
            and math.isfinite(db_time)
            and db_time + FUTURE_MARGIN < refused.tick
        ):
            heartbeat.heard(sent, db_time, heartbeat.clock.local())

    def instant(
        self, together: Collection[str], at: float, jobs: Collection[str]
    ) -> tuple[str, float, frozenset[str]] | None:
        """The claim's ``instant`` argument for ``jobs``, due at ``at`` among the
        set ``together`` (every job that comes due at ``at`` here, claimed by
        tick, whether it runs now or not), if the store claims instants: the
        set's key is a digest of its names (and of the stored schedules'
        versions), the same on every instance that has the same set."""
        if not jobs or not self._instants:
            return None
        names = sorted(together)
        versions = self.versions
        if versions:
            named: list[object] = [[n, versions[n]] if n in versions else n for n in names]
            text = json.dumps(named)
        else:
            text = json.dumps(names)
        key = blake2b(text.encode(), digest_size=16).hexdigest()  # ASCII: json escapes the rest
        return key, at, frozenset(jobs)

    async def claim(
        self,
        wanted: list[tuple[str, float]],
        *,
        manual: bool = False,
        instant: tuple[str, float, frozenset[str]] | None = None,
    ) -> Mapping[str, int | Exception] | Exception:
        """Claim ``(job, tick)`` pairs in one call: the fences by job (a job not
        there is held elsewhere, or paused), or why the store could not be used
        (fail closed: those ticks are skipped, and logged here). The releases
        gathered go first, in the same call where the store can. ``instant``:
        see `instant`."""
        store = self.store
        given = self._arguments(wanted, manual)
        if instant is not None:
            instant = self._without_unsettled(instant)
            if instant is not None:
                given["instant"] = instant
        try:
            with anyio.fail_after(store.timeout):
                fences = await self._claiming(wanted, given)
        except Exception as exc:  # noqa: BLE001 - fail closed: skip, retry next tick
            if self.health is not None:
                self.health.failed("claims", exc)
            # A StoreError is the store's own word on why it cannot be used (its
            # tables, say): the database answered. Anything else never got an answer.
            told = isinstance(exc, StoreError)
            self.logger.warning(
                "store %s, tick skipped for %d job(s) (%s): %s",
                "not usable" if told else "unreachable",
                len(wanted),
                _names([job for job, _ in wanted]),
                exc if told else repr(exc),
            )
            return exc
        if self.health is not None:
            self.health.ok("claims")
        return fences

    async def _claiming(
        self, wanted: list[tuple[str, float]], given: dict[str, Any]
    ) -> Mapping[str, int | Exception]:
        """`claim`'s call, after the releases it must follow."""
        if self._sending:
            # Their releases on their way: sent with this claim if they fail.
            await self._sent_for({job for job, _ in wanted})
        both = self._both
        if both is not None and (self._unreleased or self._ended):
            return await self._release_then_claim(both, wanted, given)
        if self._unreleased or self._ended:
            await self._release_first({job for job, _ in wanted})
        return await self.store.claim(wanted, **given)

    def _without_unsettled(
        self, instant: tuple[str, float, frozenset[str]]
    ) -> tuple[str, float, frozenset[str]] | None:
        """``instant`` without the jobs whose last release has not reached the
        store yet (gathered, on its way, or failed and to be sent again): their
        leases are this instance's until it does, so whichever instance claims
        the instant would find them held, and this one would skip them. They
        are claimed here one by one, after their releases (each job's own claim
        decides between the two).

        Nor those whose release landed since a peer may have claimed the
        instant (`PEER_EARLY`, and twice the clock's uncertainty, before it):
        the peer may have found them held, and skipped them, just before the
        release landed; losing the instant, this instance would skip them too,
        and the tick would run nowhere."""
        landed = self._landed
        key, at, jobs = instant
        heartbeat = self.heartbeat
        since = at - PEER_EARLY - (0.0 if heartbeat is None else 2 * heartbeat.uncertainty)
        while landed and landed[0][0] < since:  # past every instant to come
            landed.popleft()
        if not (self._unreleased or self._ended or self._sending or landed):
            return instant
        unsettled = {*self._unreleased, *(row.job for row in self._ended), *self._sending}
        for _, released in landed:
            unsettled.update(released)
        if unsettled.isdisjoint(jobs):
            return instant
        jobs = jobs - unsettled
        return (key, at, jobs) if jobs else None

    def _arguments(self, wanted: list[tuple[str, float]], manual: bool) -> dict[str, Any]:
        """The claim's arguments, only those in use: a store of another library
        may lack them."""
        given: dict[str, Any] = {"manual": True} if manual else {}
        if self.versions:
            given["versions"] = self.versions
        if self.replacing and not manual:
            replace = [job for job, _ in wanted if job in self.replacing]
            if replace:
                given["replace"] = replace
        if self.handing_off and not manual:
            handoffs = [job for job, _ in wanted if job in self.handing_off]
            if handoffs:
                given["handoffs"] = handoffs
        return given

    async def _release_then_claim(
        self,
        both: _Both,
        wanted: list[tuple[str, float]],
        given: dict[str, Any],
    ) -> Mapping[str, int | Exception]:
        """Send every release gathered (and those that failed before) with the
        claim, in one call."""
        rows = [*self._unreleased.values(), *self._ended]
        self._ended = []
        refused, fences = await self._sending_rows(rows, partial(both, rows, wanted, **given))
        if refused:
            self._refused(refused)
        return fences

    async def _sent_for(self, jobs: set[str]) -> None:
        """Wait until no release of ``jobs`` is on its way. Waited for before
        the claim's own releases are gathered: one that fails is then among
        them (its job's lease is this instance's until it lands, and a claim
        sent without it would find the job held)."""
        while not self._sending.isdisjoint(jobs):
            await self._sent.wait()

    async def _release_first(self, jobs: set[str]) -> None:
        """Before claiming ``jobs``: send the releases that failed before and the
        gathered ones of these jobs."""
        ended = [row for row in self._ended if row.job in jobs]
        if ended:
            self._ended = [row for row in self._ended if row.job not in jobs]
        rows = [*self._unreleased.values(), *ended]
        if rows:
            await self._send(rows)

    def release_soon(self, ended: Ended) -> None:
        """Queue the release of one claim; `run` sends it within ``GATHER``."""
        self._unreleased.pop(ended.job, None)  # an older claim's: superseded
        self._ended.append(ended)
        wanted = self._wanted
        if wanted is not None:
            self._wanted = None  # set once: the runs ending together gather behind it
            wanted.set()

    async def run(self) -> None:
        """The releases' task: sends what `release_soon` gathers, until cancelled."""
        try:
            while True:
                wanted = anyio.Event()
                if not self._ended:
                    self._wanted = wanted
                    await wanted.wait()
                await anyio.sleep(GATHER)  # the others ending now join the batch
                await self.flush()
        finally:
            self._wanted = None

    async def flush(self) -> None:
        """Send the releases gathered so far (and those that failed before)."""
        rows = [*self._unreleased.values(), *self._ended]
        self._ended = []
        if not rows:
            return
        try:
            with anyio.fail_after(self.store.timeout):
                refused = await self._send(rows)
        except Exception as exc:  # noqa: BLE001 - retried; else the leases run out
            self.logger.warning(
                "could not release the claims of %s (%r); retried before the next claim, "
                "or each frees when its lease ends",
                _names([row.job for row in rows]),
                exc,
            )
            return
        if refused:
            self._refused(refused)

    def _refused(self, refused: Mapping[str, Exception]) -> None:
        # The database refuses these rows (a value it cannot store): sending
        # them again would fail again. Their leases free the jobs.
        self.logger.warning(
            "the database refused the release of %s (%r); each frees when its lease ends",
            _names(list(refused)),
            next(iter(refused.values())),
        )

    async def _send(self, rows: list[Ended]) -> Mapping[str, Exception]:
        return await self._sending_rows(rows, partial(self.store.release, rows))

    async def _sending_rows(self, rows: list[Ended], send: Callable[[], Awaitable[_T]]) -> _T:
        """``send()``, which releases ``rows`` (the unreleased ones among them):
        kept to be sent again if the call fails, dropped once it went through
        or the database refused them."""
        jobs = [row.job for row in rows]
        for job in jobs:
            self._unreleased.pop(job, None)
        self._sending.update(jobs)
        try:
            sent = await send()
        except BaseException:
            for row in rows:
                self._unreleased.setdefault(row.job, row)
            raise
        finally:
            self._sending.difference_update(jobs)
            self._sent.set()
            self._sent = anyio.Event()
        heartbeat = self.heartbeat
        if self._instants and heartbeat is not None:
            now, landed = heartbeat.clock.now(), self._landed
            while landed and landed[0][0] < now - LANDED_FOR:
                landed.popleft()
            landed.append((now, jobs))
        return sent
