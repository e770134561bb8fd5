"""The jobs of the schedules made at run time that this instance runs.

A stored schedule this instance can run is a job like a declared one: a `Job`
of its task with the schedule's arguments bound, and a runner in the
scheduler's runners. A change makes a new job and runner, which takes over the
old one's stats, history and operator's pause; the old one ends after its run
in flight (the dispatcher drops ticks while it goes, as for any run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from .._core.declarations import check_catch_up
from .._core.lifecycle import CurrentRun
from .._core.parts import Parts
from .._core.runner import JobRunner
from .._job import Job
from .._redaction import hidden
from .stored import StoredSchedule, Task

__all__ = ["Bound", "StoredJobs"]


class Bound(partial[Any]):
    """A task with a schedule's arguments bound (a stored schedule's `Job.func`):
    its repr, which a job's repr holds, hides what a listing hides."""

    __slots__ = ()

    def __repr__(self) -> str:
        given = ", ".join(f"{key}={value!r}" for key, value in hidden(self.keywords).items())
        return f"functools.partial({self.func!r}, {given})"


class StoredJobs:
    """The runners of the stored schedules run here, by name."""

    def __init__(
        self, parts: Parts, current: CurrentRun, made_anew: Callable[[JobRunner], None]
    ) -> None:
        self._parts = parts
        self._current = current
        self._made_anew = made_anew
        self._runners: dict[str, JobRunner] = {}

    def runs(self, name: str) -> bool:
        """Whether ``name`` is a stored schedule's job run here."""
        return name in self._runners

    def build(self, stored: StoredSchedule, tasks: Mapping[str, tuple[Task, bool]]) -> Job:
        """The job of ``stored`` (`Job.build`'s checks: `ConfigurationError`)."""
        func, _ = tasks[stored.task]
        bound = Bound(func, **stored.kwargs) if stored.kwargs else func
        options: dict[str, Any] = {"name": stored.name, **stored.options}
        job = Job.build(bound, stored.schedule, options, where="add_schedule", task=stored.task)  # type: ignore[arg-type]
        check_catch_up(job, self._parts.store)
        return job

    def install(self, job: Job, version: int) -> None:
        """Run ``job`` here from now on, in place of its schedule's job before."""
        parts = self._parts
        runner = JobRunner(
            job, parts.ticking, parts.logger, parts.leases, parts.history, parts.observers
        )
        old = self._runners.get(job.name)
        if old is None:
            self._made_anew(runner)  # the store's pause of the name applies anew
        else:
            # The schedule's job goes on, under its new spec: its counts, its
            # history and its pause are the same job's (the old ends after its run).
            runner.take_over(old)
        self._runners[job.name] = parts.runners[job.name] = runner
        if runner.leases is not None and parts.capabilities.schedules is not None:
            # Its claims carry the version (a store without a schedules table,
            # a store of one's own, keeps schedules in this process: no check).
            parts.versions[job.name] = version
        else:
            parts.versions.pop(job.name, None)
        running = self._current.running
        if running is not None:
            running.adopt(runner)
            refused = self._refused(job.name)
            if refused is not None:
                # Its tick refused under the old version (the change was made
                # elsewhere): the new version's, if the change kept it.
                runner.handed(refused, None)

    def _refused(self, name: str) -> float | None:
        """The tick of ``name`` whose claim the store refused under the version
        run here before (`Claims.changed`), if one waits for the new version."""
        running = self._current.running
        claims = None if running is None else running.claims
        return None if claims is None else claims.changed.pop(name, None)

    def retire(self, name: str) -> None:
        """Run the schedule ``name`` here no more (after its run in flight)."""
        old = self._runners.pop(name, None)
        if old is None:
            return
        parts = self._parts
        parts.runners.pop(name, None)
        parts.versions.pop(name, None)
        # A tick it takes from now on, or whose claim is on its way, does not run.
        old.retired = True
        old.stop()  # after its run in flight
        refused = self._refused(name)
        if refused is not None:
            old.changed_away(refused, "it is not run here any more")
        for tell in parts.leaving:
            tell(old)  # its counts go with it: the metrics keep them
        running = self._current.running
        if running is not None:
            running.let_go()
