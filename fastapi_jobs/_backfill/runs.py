"""Backfill: a job run once for every tick of its schedule in a past range,
oldest first, in the running scheduler (``Scheduler.backfill``, ``POST
/jobs/{name}/backfill``, ``fastapi-jobs backfill``).

Each tick is run as a trigger is (``_core.manual_runs``): by the job's own task, so a
backfill run and a live one never overlap in a process (a live tick that comes
during a backfill run is handled as any tick meeting a run: the job's overlap
policy, by default dropped as ``overlap``). With a store each tick is claimed
first (``SQLAlchemyStore.backfills``): a tick that ran already, anywhere, is
skipped, and a lease held elsewhere is waited for. Its run is released with
its tick (``Manual(past=True)``), which the history records.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import anyio
import anyio.abc

from .._checks import is_aware, is_whole
from .._clock import as_datetime
from .._core.lifecycle import CurrentRun, Running
from .._core.parts import Parts
from .._core.runner import JobRunner
from .._errors import ConfigurationError, JobRunningError, NotRunningError, StoreError, short
from .._results import Manual
from .._schedules import Schedule
from .._status import ErrorInfo
from .._store import Ended
from .results import BackfillResult, BackfillTick

__all__ = ["MAX_TICKS", "Backfills", "Progress"]

MAX_TICKS = 1000
"""The most ticks a backfill runs unless asked for more (``max_ticks``, ``--max``)."""
MOST_TICKS = 100_000
"""The most ``max_ticks`` may be: the range's ticks are listed (and counted in
the event loop) before the first runs, and a request for a billion must not
take the app's memory."""

Progress = Callable[[int, int, BackfillTick], object]
"""Told after each tick: its number (from 1), the range's count, how it went."""

_POLL = 0.2  # how often a backfill looks again at a lease held, or a run going


def _instant(what: str, value: object) -> float:
    if not isinstance(value, datetime):
        raise ConfigurationError(
            f"backfill({what}={short(value)}): pass an aware datetime, "
            "e.g. datetime(2026, 12, 1, tzinfo=UTC)"
        )
    if not is_aware(value):
        raise ConfigurationError(
            f"backfill({what}={value.isoformat()}): the datetime has no time zone; "
            "give it one (tzinfo=UTC, or an ISO 8601 instant ending in Z or +01:00)"
        )
    return value.timestamp()


def ticks_in(schedule: Schedule, since: float, until: float, limit: int) -> list[float]:
    """The schedule's ticks ``t``, ``since <= t <= until``, oldest first; at most
    ``limit + 1`` of them (one more than allowed says there are too many)."""
    try:
        tick = schedule.last_at_or_before(since)
    except NotImplementedError as exc:  # a Schedule of the user's that cannot look back
        raise ConfigurationError(f"cannot backfill on this schedule: {exc}") from None
    if tick < since:
        tick = schedule.next_after(since)
    found: list[float] = []
    while tick <= until and len(found) <= limit:
        found.append(tick)
        tick = schedule.next_after(tick)
    return found


_CHANGED = (
    "the job's schedule was changed or removed since the backfill began: no tick runs "
    "under the old spec; start a new backfill to run the rest under the new one"
)


class Backfills:
    """A scheduler's backfills: checked, run one tick at a time, one per job."""

    def __init__(self, parts: Parts, current: CurrentRun) -> None:
        self._parts = parts
        self._current = current
        self.going: set[str] = set()
        """The jobs a backfill runs for now (one each)."""
        self._tg: anyio.abc.TaskGroup | None = None  # the service's, while it runs
        self._served = False

    # -- asking -----------------------------------------------------------

    def check(
        self, name: str, since: object, until: object, max_ticks: object
    ) -> tuple[JobRunner, list[float]]:
        """The job's runner and the range's ticks; else what is wrong, raised
        (`JobNotFoundError`, `ConfigurationError`, `NotRunningError`,
        `JobRunningError` for a backfill of the job going already)."""
        runner = self._parts.runner(name)
        if not is_whole(max_ticks, 1, MOST_TICKS):
            raise ConfigurationError(
                f"backfill(max_ticks={short(max_ticks)}): the most ticks to run, a whole "
                f"number from 1 to {MOST_TICKS:,} (default {MAX_TICKS})"
            )
        start, end = _instant("since", since), _instant("until", until)
        if start > end:
            raise ConfigurationError(
                f"backfill(): the range is reversed: since={as_datetime(start).isoformat()} is "
                f"after until={as_datetime(end).isoformat()}; pass since <= until"
            )
        running = self._current.running
        if running is None or runner.stopping:
            raise NotRunningError(
                f"cannot backfill {name!r}: the scheduler is not running (backfill runs "
                "in the running app, or with `fastapi-jobs backfill`)"
            )
        now = self._parts.ticking.now()
        if end > now:
            raise ConfigurationError(
                f"backfill(until={as_datetime(end).isoformat()}): the range must be in the past, "
                f"and until is after now ({as_datetime(now).isoformat()}): pass until <= now"
            )
        if runner.leases is not None and self._parts.capabilities.backfills is None:
            raise ConfigurationError(
                f"cannot backfill {name!r}: this store cannot claim past ticks (it has no "
                "`backfills`, a PastTicks; fastapi_jobs.stores.SQLAlchemyStore has)"
            )
        ticks = ticks_in(runner.job.schedule, start, end, max_ticks)
        if len(ticks) > max_ticks:
            raise ConfigurationError(
                f"backfill(): the range has more than max_ticks={max_ticks} ticks of job "
                f"{name!r} ({as_datetime(start).isoformat()} to "
                f"{as_datetime(end).isoformat()}): pass a higher max_ticks (or --max), or a "
                "shorter range"
            )
        if name in self.going:
            raise JobRunningError(name, message=f"a backfill of job {name!r} is going already")
        return runner, ticks

    async def run(
        self,
        name: str,
        since: object,
        until: object,
        max_ticks: object = MAX_TICKS,
        progress: Progress | None = None,
    ) -> BackfillResult:
        """Check, then run every tick of the range (see `Scheduler.backfill`)."""
        runner, ticks = self.check(name, since, until, max_ticks)
        assert isinstance(since, datetime) and isinstance(until, datetime)
        self.going.add(name)
        try:
            return await self._run_ticks(runner, ticks, since, until, progress)
        finally:
            self.going.discard(name)

    async def _run_ticks(
        self,
        runner: JobRunner,
        ticks: list[float],
        since: datetime,
        until: datetime,
        progress: Progress | None,
    ) -> BackfillResult:
        running = self._current.running
        assert running is not None
        # The version of the stored schedule this runner runs (its claims carry
        # it): taken with the runner, which a change replaces (and stops) at once.
        claims = running.claims
        name = runner.job.name
        version = None if claims is None or runner.stopping else claims.versions.get(name)
        done: list[BackfillTick] = []
        stopped: str | None = None
        for tick in ticks:
            outcome = await self._one(runner, running, tick, version)
            done.append(outcome)
            if progress is not None:
                progress(len(done), len(ticks), outcome)
            if outcome.outcome in ("not_run", "store_unavailable"):
                stopped = outcome.error
                break
        return BackfillResult.of(runner.job.name, since, until, len(ticks), done, stopped)

    # -- in the background (the control router's) -------------------------

    def serve_in(self, add_service: Callable[[str, Callable[[], Any]], None]) -> None:
        """Run the backfills started by `start` in a service of the scheduler."""
        if not self._served:
            self._served = True
            add_service("backfills", self._serve)

    async def _serve(self) -> None:
        # Cancelled as the scheduler stops: each backfill stops, its run in flight
        # ends as any (it is the job's task's).
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await anyio.sleep_forever()
            finally:
                self._tg = None

    def start(
        self, runner: JobRunner, ticks: list[float], since: datetime, until: datetime
    ) -> None:
        """Run a checked backfill in the background (`serve_in`)."""
        tg = self._tg
        if tg is None:
            raise NotRunningError(
                f"cannot backfill {runner.job.name!r}: the backfills' service is not running "
                "(it starts with the scheduler, if the control router was built before)"
            )
        name = runner.job.name
        self.going.add(name)  # at once: a second request sees it (409)

        async def backfill() -> None:
            try:
                await self._run_ticks(runner, ticks, since, until, self._logged(name))
            except Exception:
                runner.logger.exception("job %r: the backfill failed", name)
            finally:
                self.going.discard(name)

        tg.start_soon(backfill, name=f"fastapi_jobs: backfill {name}")

    def _logged(self, name: str) -> Progress:
        logger = self._parts.logger

        def told(number: int, count: int, tick: BackfillTick) -> None:
            logger.info(
                "job %r: backfill [%d/%d] %s %s",
                name,
                number,
                count,
                tick.tick.isoformat(),
                tick.describe(),
                extra={"job": name},
            )

        return told

    # -- one tick ---------------------------------------------------------

    async def _one(
        self, runner: JobRunner, running: Running, tick: float, version: int | None
    ) -> BackfillTick:
        """Run ``tick`` of ``runner``'s job (claimed first, with a store, under
        ``version`` if it is a stored schedule's): how it went."""
        at = as_datetime(tick)
        if not await self._free(runner, running):
            return self._stopped(runner, at)
        fence: int | None = None
        claimed_at = anyio.current_time()
        if runner.leases is not None:
            got = await self._claim(runner, running, tick, version)
            if not isinstance(got, int):
                return got
            fence = got
        manual = Manual(past=fence is not None)
        runner.take(tick, manual)
        if fence is not None:
            runner.claimed(fence, claimed_at)
        runner.wake()
        await manual.done.wait()
        if fence is not None and running.claims is not None:
            await running.claims.flush()  # in the history, and the lease free again
        ran = manual.ran
        if ran is None:
            if self._parts.runners.get(runner.job.name) is not runner:
                return self._stopped(runner, at)
            return BackfillTick(at, "not_run", None, "the app stopped, or the lease was lost")
        return BackfillTick.of(at, ran)

    async def _free(self, runner: JobRunner, running: Running) -> bool:
        """Wait for the job to be free here (a live run going ends first);
        False if the app stops meanwhile."""
        while True:
            if runner.stopping or self._current.running is not running:
                return False
            if not runner.busy:
                return True
            await anyio.sleep(_POLL / 4)

    def _stopped(self, runner: JobRunner, at: datetime) -> BackfillTick:
        """The tick the backfill stops at, as the job's runner here stopped: the
        app stopping, or the job's schedule changed or removed (its runner
        replaced, here or as this instance heard of it)."""
        if self._parts.runners.get(runner.job.name) is not runner:
            return BackfillTick(at, "not_run", None, _CHANGED)  # replaced, or removed
        return BackfillTick(at, "not_run", None, "the app is stopping")

    async def _claim(
        self, runner: JobRunner, running: Running, tick: float, version: int | None
    ) -> int | BackfillTick:
        """The fence of the claim of ``tick``, or how the tick went instead: ran
        already, its lease held for a whole lease (``held``), the store out, the
        job's schedule changed or removed since the backfill began."""
        store, past, at = runner.store, self._parts.capabilities.backfills, as_datetime(tick)
        assert store is not None and past is not None
        # A lease held by a run going elsewhere is waited for, up to a lease's length:
        # longer, and the job runs on elsewhere (or its holder died): skipped.
        give_up = anyio.current_time() + store.lease
        while True:
            runner.take(tick)  # no live tick starts here while it claims
            try:
                got = await past.claim(runner.job.name, tick, version)
            except Exception as exc:  # noqa: BLE001 - the tick's outcome, and the end
                return BackfillTick(
                    at,
                    "store_unavailable",
                    None,
                    f"the store cannot be reached ({ErrorInfo.of(exc)})",
                )
            finally:
                runner.free(cancel=False)
            if got == "ran":
                return BackfillTick(at, "ran_already", None, None)
            if got == "changed":
                return BackfillTick(at, "not_run", None, _CHANGED)
            if isinstance(got, int):
                if runner.stopping or self._current.running is not running:
                    self._give_back(runner, running, got)
                    return self._stopped(runner, at)
                if not runner.busy:
                    return got
                self._give_back(runner, running, got)  # a live run began meanwhile
            elif anyio.current_time() >= give_up:
                return BackfillTick(at, "held", None, "its lease stayed held elsewhere")
            await anyio.sleep(_POLL)
            if not await self._free(runner, running):
                return self._stopped(runner, at)

    def _give_back(self, runner: JobRunner, running: Running, fence: int) -> None:
        claims = running.claims
        if claims is None:
            raise StoreError("the claims are gone: the app stopped")
        claims.release_soon(Ended(runner.job.name, fence, None, None, 0.0, 0, True))
