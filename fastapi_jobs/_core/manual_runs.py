"""Operating a scheduler's jobs by hand: a run now in the running app (``trigger``,
and the CLI's run of the current tick), and a run outside it (``run_now``).

A run by hand goes the way a tick does: claimed first where the job is claimed
(so no scheduled tick runs beside it on any instance), then handed to the job's
own task, which runs and records it. Pauses are in ``_core.pauses``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

from .._checks import flag
from .._clock import as_datetime
from .._control import TriggeredRun
from .._errors import (
    ConfigurationError,
    JobRunningError,
    NotRunningError,
    StoreError,
    TickAheadError,
    short,
)
from .._results import Manual, RunResult
from .._status import ErrorInfo, utc
from .._store import Ended
from .claims import Claims
from .history import run_id
from .lifecycle import CurrentRun
from .parts import Parts
from .reader import Reader
from .runner import JobRunner

__all__ = ["Operator"]


class Operator:
    """Starts runs by hand, in the running scheduler or outside it."""

    def __init__(self, parts: Parts, current: CurrentRun, reader: Reader) -> None:
        self._parts = parts
        self._current = current
        self._reader = reader

    async def trigger(self, name: str, *, wait: bool) -> TriggeredRun:
        flag("wait", wait, context="trigger(): ")
        triggered = await self.start(name, self._parts.ticking.now(), by_hand=True)
        if wait:
            await triggered.wait()
        return triggered

    async def start_current_tick(self, name: str) -> TriggeredRun:
        """Claim the job's current tick (the latest due) and start its run here:
        what ``fastapi-jobs run`` does. `JobRunningError` if it is taken."""
        runner = self._parts.runner(name)
        tick = runner.job.schedule.last_at_or_before(self._parts.ticking.now())
        return await self.start(name, tick, by_hand=False)

    async def start(self, name: str, tick: float, *, by_hand: bool) -> TriggeredRun:
        """Start a run of ``name`` for ``tick`` in its task (claimed first, with a
        store). ``by_hand``: the claim ignores a pause (else a paused job's claim
        is refused, as a tick's is)."""
        parts = self._parts
        runner = parts.runner(name)
        running = self._current.running
        if running is None or runner.stopping:
            raise NotRunningError(
                f"cannot trigger {name!r}: the scheduler is not running (in tests, "
                "run_now() runs a job without the app)"
            )
        if runner.busy:
            raise self._busy(runner)
        manual = Manual()
        runner.take(tick, manual)  # no scheduled tick starts here meanwhile
        fence: int | None = None
        if runner.leases is not None:
            claims = running.claims
            assert claims is not None
            try:
                fence = await self._claim(runner, claims, tick, by_hand)
            except BaseException:
                runner.free()
                raise
        runner.wake()
        claims = running.claims
        return TriggeredRun(
            name=name,
            # Its number among the job's runs here (they are recorded one at a time).
            id=run_id(
                parts.instance.id, 0 if runner.history is None else runner.history.count, fence
            ),
            tick=as_datetime(tick),
            instance=parts.instance.id,
            _manual=manual,
            _flush=None if fence is None or claims is None else claims.flush,
        )

    async def _claim(self, runner: JobRunner, claims: Claims, tick: float, by_hand: bool) -> int:
        """The fence of ``runner``'s claim of ``tick``, made now; else why not, raised."""
        name = runner.job.name
        claimed_at, sent = anyio.current_time(), claims.reading()
        fences = await claims.claim([(name, tick)], manual=by_hand)
        if isinstance(fences, StoreError):  # its text is the store's, free of secrets
            raise StoreError(f"cannot trigger {name!r}: {fences}; nothing ran") from fences
        if isinstance(fences, Exception):
            raise StoreError(
                f"cannot trigger {name!r}: the store cannot be reached ({ErrorInfo.of(fences)}); "
                "nothing ran"
            ) from fences
        got = fences.get(name)
        if isinstance(got, TickAheadError):
            claims.heard(got, sent, [name])
            raise StoreError(f"cannot trigger {name!r}: {got}; nothing ran, try again")
        if isinstance(got, Exception):
            raise StoreError(
                f"cannot trigger {name!r}: the database refused its claim "
                f"({ErrorInfo.of(got)}); "
                "nothing ran"
            )
        if got is None:
            raise await self._held_elsewhere(name, tick)
        if runner.stopping:  # the app began to stop while we claimed
            claims.release_soon(Ended(name, got, None, None, 0.0, 0, True))  # never ran
            raise NotRunningError(f"cannot trigger {name!r}: the app is stopping")
        runner.claimed(got, claimed_at)
        return got

    def _busy(self, runner: JobRunner) -> JobRunningError:
        name = runner.job.name
        if runner.in_flight and not runner.stats.running:
            return JobRunningError(
                name, message=f"job {name!r} is starting a run here (its tick is being claimed)"
            )
        return JobRunningError(name, utc(runner.stats.last_started_at), self._parts.instance.id)

    async def _held_elsewhere(self, name: str, tick: float) -> JobRunningError:
        """Why a claim was refused: the job's lease is held (by whom, since when),
        or (for a claim that heeds pauses) it is paused, or its tick was claimed."""
        view = await self._reader.cluster()
        held = None if view is None else view.jobs.get(name)
        if held is not None and held.running_on is not None:
            return JobRunningError(name, held.last_started_at, held.running_on)
        if view is not None and view.pauses.get(name, 0.0) > self._parts.ticking.now():
            return JobRunningError(name, message=f"job {name!r} is paused in the store")
        last, at = None if held is None else held.last_tick, as_datetime(tick)
        if held is not None and last is not None and last > at:
            # A claim is for a tick after the last one only.
            now = as_datetime(self._parts.ticking.now())
            if last > now:  # the database's clock is behind the job's last claim
                return JobRunningError(
                    name,
                    message=f"job {name!r} last ran for {last.isoformat()}, later than now "
                    f"on the database's clock ({now.isoformat()}; stepped back?): try again "
                    "after it",
                )
            return JobRunningError(
                name,
                message=f"job {name!r} last ran for {last.isoformat()} (a run by hand, or a "
                f"later tick), after the tick {at.isoformat()} asked for: a tick runs once, "
                "and never after a later one; its next tick runs",
            )
        if held is not None and last is not None and last == at:
            return JobRunningError(
                name,
                message=f"the tick {at} of job {name!r} was claimed already, by "
                f"{held.last_instance} (outcome: {held.last_outcome})",
            )
        return JobRunningError(name, message=f"job {name!r}: its claim was refused")

    async def run_now(self, name: str, state: Mapping[str, Any] | None) -> RunResult:
        runner = self._parts.runner(name)
        if runner.busy:
            raise JobRunningError(name)
        if state is None:
            running = self._current.running
            state = running.state if running is not None else {}
        elif not isinstance(state, Mapping):
            raise ConfigurationError(
                f"run_now(state={short(state)}): pass a mapping (what the app's lifespan "
                "yields, e.g. {'db': engine}), or nothing for the running app's"
            )
        tick = self._parts.clock.now()
        ran = await runner.attempts(tick, state, Manual())
        return RunResult.of(name, as_datetime(tick), ran)
