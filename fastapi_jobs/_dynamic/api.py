"""The scheduler's methods for schedules made at run time: the signatures and
docstrings users see, each handing its call to the book (``_dynamic.book``).

``Scheduler`` takes them from `ScheduleMethods` (one concern, one module), as
it takes its other sides' work from theirs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Unpack, overload

from .._schedules import Schedule
from .book import ScheduleBook
from .stored import ScheduleOptions, StoredSchedule

__all__ = ["ScheduleMethods"]

F = TypeVar("F", bound=Callable[..., Any])


class ScheduleMethods:
    """`Scheduler`'s part for schedules as data."""

    _book: ScheduleBook

    @overload
    def task(self, func: F, /) -> F: ...
    @overload
    def task(self, func: None = None, /, *, name: str | None = None) -> Callable[[F], F]: ...

    def task(self, func: Any = None, /, *, name: str | None = None) -> Any:
        """Register a function that schedules made at run time may name
        (`add_schedule`), by its name or ``name``: ``@scheduler.task()``.

        It takes the run's context first if it wants it (``ctx: JobContext``),
        then the schedule's arguments by keyword: ``async def report(ctx:
        JobContext, tenant: str) -> None``. Returned unchanged.
        """
        if func is not None:
            self._book.add_task(func, name)
            return func

        def register(func: F) -> F:
            self._book.add_task(func, name)
            return func

        return register

    @property
    def tasks(self) -> Mapping[str, Callable[..., Any]]:
        """The functions schedules may name, by name."""
        return {name: func for name, (func, _) in self._book.tasks.items()}

    async def add_schedule(
        self,
        name: str,
        task: str | Callable[..., Any],
        schedule: Schedule,
        *,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> StoredSchedule:
        """Make a schedule at run time: ``task`` (a function registered with
        `task`, or its name) runs on ``schedule`` (an `Every` or a `Cron` in a
        named zone) with ``kwargs`` (JSON values the function takes), as a job
        named ``name`` with the job's options (``timeout``, ``retries``,
        ``retry_backoff``, ``retry_timeouts``, ``paused``, ``catch_up``,
        ``every_instance``).

        With a store it is kept in the store (the scheduler must be running):
        every instance runs it from its next heartbeat on (this one at once),
        each tick once across them, and it is back after a restart. Without
        one it lives in this process.

        Raises `ConfigurationError` for anything the schedule cannot be (the
        task unknown, arguments it does not take or that are not JSON, a
        duplicate name or a declared job's), `StoreError` when the store
        could not make it (nothing changed), and `UnconfirmedError` when
        the store did not answer in time (it may have been made).
        """
        return await self._book.add(name, task, schedule, kwargs, options)

    async def update_schedule(
        self,
        name: str,
        *,
        task: str | Callable[..., Any] | None = None,
        schedule: Schedule | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> StoredSchedule:
        """Change a schedule made at run time: what is given replaces what it
        had (``kwargs`` as a whole; each option given, that option), the rest
        stays. Once this returns, no instance claims a tick of it under the old
        spec; a run going under it ends as it would have. Raises
        `JobNotFoundError` for an unknown name, else as `add_schedule`."""
        return await self._book.update(
            name, task=task, schedule=schedule, kwargs=kwargs, options=options
        )

    async def remove_schedule(self, name: str) -> None:
        """Remove a schedule made at run time: once this returns, no instance
        claims a tick of it; a run going ends as it would have. Raises
        `JobNotFoundError` for an unknown name, else as `add_schedule`."""
        await self._book.remove(name)

    async def schedules(self) -> list[StoredSchedule]:
        """Every schedule made at run time, by name (with a store: as the store
        has it now, including those this instance cannot run: ``known=False``)."""
        return await self._book.list()
