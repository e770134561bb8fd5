"""Pauses: what ``pause``/``resume`` change, and how readings of the store's
pauses (each heartbeat, each ``GET /jobs``) are applied.

Without a store a pause is this process's (``runner.paused_until``). With one it
is the store's row, versioned: a reading may have begun before a change this
process made (or applied) and answer after it, so only a newer version than
the one applied here changes a job's pause.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

import anyio

from .._control import check_until
from .._errors import StoreError, UnconfirmedError
from .._status import ClusterView, ErrorInfo, PauseState, pause_end, utc
from .parts import Parts
from .runner import JobRunner

__all__ = ["Pauses"]

# A pause or resume is waited for this many store timeouts: the store decides
# within one and answers within two (see Store.pause).
_CHANGE_WAIT = 3


class Pauses:
    """The pauses of a scheduler's jobs, and the version of each this process applied."""

    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._versions: dict[str, int] = {}
        self._read: dict[str, tuple[float, int]] = {}
        """The store's pauses as last read (by job name): a job made anew under
        a name takes its row at once, not at the next reading."""

    def forget(self) -> None:
        """A start: the store's pauses are not known until it is read again."""
        self._versions.clear()
        self._read.clear()

    def made_anew(self, runner: JobRunner) -> None:
        """A job made anew (a schedule made at run time, under a name that may
        have been removed and paused before): the store's pause of its name,
        as last read, applies to it now, and the next reading after that. A
        pause outlives its schedule's removal, so the job would otherwise show
        unpaused (and count its ticks as claimed elsewhere) until the next
        heartbeat."""
        name = runner.job.name
        self._versions.pop(name, None)
        row = self._read.get(name)
        if row is not None:
            self._apply_one(runner, *row)

    async def pause(self, name: str, until: datetime | None) -> PauseState:
        runner = self._parts.runner(name)
        until_ts = check_until(until, self._parts.ticking.now())
        await self._change(runner, until_ts)
        return self.state(runner)

    async def resume(self, name: str) -> PauseState:
        runner = self._parts.runner(name)
        await self._change(runner, None, resume=True)
        return self.state(runner)

    def paused(self, name: str) -> bool | None:
        """Whether ``name`` is paused here now (with a store: as the store has it,
        from the last heartbeat, and as declared); None if the store's pauses
        could not be read (for a job that no claim guards)."""
        runner = self._parts.runner(name)
        if runner.pause_unknown:
            return None
        return runner.paused_until > self._parts.ticking.now()

    def state(self, runner: JobRunner) -> PauseState:
        until = runner.paused_until
        now = self._parts.ticking.now()
        return PauseState(
            job=runner.job.name,
            paused=until > now,
            until=pause_end(until, now),
            scope="cluster" if self._parts.store is not None else "process",
        )

    async def _change(
        self, runner: JobRunner, until: float | None, *, resume: bool = False
    ) -> None:
        parts, name = self._parts, runner.job.name
        store = parts.store
        paused_until = 0.0 if resume else math.inf if until is None else until
        verb = "resume" if resume else "pause"
        if store is None:
            runner.pause(paused_until)
        else:
            try:
                # The store decides within its timeout and answers within twice
                # that: waited for, so that the answer says what became of it.
                with anyio.fail_after(_CHANGE_WAIT * store.timeout):
                    if resume:
                        version = await store.resume(name)
                    else:
                        version = await store.pause(name, until)
            except StoreError as exc:
                raise StoreError(
                    f"cannot {verb} {name!r}: {exc}; nothing changed: ask again once the "
                    "store answers"
                ) from exc
            except Exception as exc:
                raise UnconfirmedError(
                    f"the store did not confirm the {verb} of {name!r} in time "
                    f"({ErrorInfo.of(exc)}): it may have been made; GET /jobs/{name} "
                    "shows whether it was"
                ) from exc
            self._apply_one(runner, paused_until, version)
        parts.logger.info(
            "job %r %s%s",
            name,
            "resumed" if resume else "paused",
            "" if resume or until is None else f" until {utc(until)}",
            extra={"job": name},
        )

    def apply(self, pauses: Mapping[str, tuple[float, int]]) -> None:
        """A reading of the store's pauses (each heartbeat, GET /jobs): each job's
        pause as the cluster has it, where it is newer than what this process has.
        A reading may have begun before a change this process made or applied
        since, and answer after it; its older rows are left out. A job it does not
        list keeps what it has (the reading may be older than the job's row)."""
        runners = self._parts.runners
        for runner in runners.values():
            runner.pause_read()  # the first reading since the start: now known
        self._read.update(pauses)
        for name, (until, version) in pauses.items():
            listed = runners.get(name)
            if listed is not None:
                self._apply_one(listed, until, version)

    def apply_view(self, view: ClusterView) -> None:
        """The pauses of a reading of the cluster (``Store.read``), applied."""
        versions = view.pause_versions
        self.apply({name: (until, versions.get(name, 0)) for name, until in view.pauses.items()})

    def _apply_one(self, runner: JobRunner, paused_until: float, version: int) -> None:
        name = runner.job.name
        if version > self._versions.get(name, -1):
            runner.pause(paused_until)
            self._versions[name] = version
