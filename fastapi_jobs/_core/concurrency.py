"""asyncio and trio: asyncio's own primitives where they are cheaper, anyio's
portable ones elsewhere, in one place.

The library is written against anyio, but anyio finds the running library on
each call (~1 µs, a tenth of a tick's whole cost) and its tasks, events and
scopes cost more than asyncio's (an anyio task ~60 µs and ~3 KiB more to
start: its own cancel scope, event and wrapper coroutine). On the per-tick
path the scheduler therefore uses asyncio's own on asyncio, and anyio's on any
other backend (trio). The choice is made once per running scheduler, when the
dispatcher and the jobs' tasks' owner start (`backend`); what it gives
(a checkpoint, each job's `TaskHandle` and its gates) is then used
without asking again. Clocks are the exception: a clock is used outside a
running scheduler too, so `sleep` looks each time (asyncio first).

What differs, and why:

- a job's task is an asyncio task (cancelled by ``Task.cancel``; a lost
  lease's cancellation is taken back with ``Task.uncancel``), which its runner
  holds itself, or an anyio task in its own scope (a `ScopedHandle`; a claimed
  run then gets a scope of its own, which a lost lease cancels);
- a parked task waits on a future (asyncio), or on an `anyio.Event`
  awaited the same way (`_EventGate`);
- a cancellation: ``asyncio.CancelledError`` is tested for first, since
  10,000 tasks stop at once at shutdown.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator
from functools import partial
from typing import Any, Protocol, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

__all__ = [
    "Backend",
    "Bindable",
    "Gate",
    "Handle",
    "ScopedHandle",
    "backend",
    "cancelled_from_outside",
    "in_thread",
    "is_cancellation",
    "sleep",
    "thread_event",
    "waited",
]

T = TypeVar("T")

# Cancelled with the owner, tasks that do not end within this are left behind.
_ABANDON_AFTER = 5.0
# Ended tasks kept in the owner's list before it is pruned (and while they are
# fewer than the live ones): a handful of jobs' tasks are never worth a prune.
_KEEP_ENDED = 64


def sleep(delay: float) -> Awaitable[None]:
    """``anyio.sleep``, as asyncio's own sleep on asyncio."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.sleep(delay)
    return asyncio.sleep(delay)


def thread_event() -> threading.Event:
    """The event a job's worker thread sets as it ends; under looptime, one
    its virtual clock waits for.

    looptime fast-forwards its clock whenever the loop has nothing to do, and
    a thread started by ``anyio.to_thread`` is nothing it can see: virtual time
    ran past a sync job's thread (an every-minute job ran 11 to 52 times in a
    virtual hour, and a test's shutdown cut it at its deadline). It waits in
    real time for what ``loop.run_in_executor`` runs: the event is given such
    a future, completed once it is set and its waiter has gone on (`_Seen`).
    No thread waits for it: a thread of the loop's own executor each did, and
    six sync jobs at once took them all from the app's DNS lookups. On any
    other loop, a plain event."""
    looptime = sys.modules.get("looptime")  # never imported: not its loop
    if looptime is None:
        return threading.Event()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio
        return threading.Event()
    if not isinstance(loop, looptime.LoopTimeEventLoop):
        return threading.Event()
    ended: concurrent.futures.Future[None] = concurrent.futures.Future()
    loop.run_in_executor(_AS_GIVEN, _given, ended)
    return _Seen(ended)


class _Seen(threading.Event):
    """An event whose future completes once it is set (the thread ended) and
    its waiter has gone on (`waited`): the thread's result reaches the loop
    after the event is set, and virtual time must not run on in between."""

    def __init__(self, ended: concurrent.futures.Future[None]) -> None:
        super().__init__()
        self._ended = ended
        self._waited = False

    def set(self) -> None:
        super().set()
        if self._waited:  # read after the set: see `waited`
            self._end()

    def waited(self) -> None:
        self._waited = True
        if self.is_set():  # one of the two (or both) ends it, whatever the order
            self._end()

    def _end(self) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # ended twice
            self._ended.set_result(None)


def waited(done: threading.Event) -> None:
    """The loop's side is done with ``done``'s thread (its result is in, or it
    was abandoned): virtual time may go on once the thread has ended too."""
    if isinstance(done, _Seen):
        done.waited()


def _given(future: concurrent.futures.Future[None]) -> None:
    raise AssertionError("never called: the executor hands the future back")


class _Handing(concurrent.futures.Executor):
    """An executor that runs nothing: it hands back the future it is given,
    for ``run_in_executor`` to wrap (and looptime to wait for)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return args[0]


_AS_GIVEN = _Handing()


async def in_thread(func: Callable[..., T], *args: object) -> T:
    """``anyio.to_thread.run_sync(func, *args)`` (waited for, never abandoned),
    its thread seen by a test's virtual time (`thread_event`)."""
    done = thread_event()
    try:
        return await anyio.to_thread.run_sync(func, *args)
    finally:  # it returned, or never started
        done.set()
        waited(done)


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is the running library's cancellation."""
    if isinstance(exc, asyncio.CancelledError):
        return True
    return isinstance(exc, anyio.get_cancelled_exc_class())


def cancelled_from_outside(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation that someone asked for, as opposed
    to a ``CancelledError`` the job's own code raised (a future that something
    else cancelled, say), which is the job's failure."""
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        # Every cancellation of a task (ours, anyio's scopes, the caller's)
        # goes through task.cancel(), which counts itself here.
        return task is None or task.cancelling() > 0
    return isinstance(exc, anyio.get_cancelled_exc_class())


class Gate(Protocol):
    """What a parked job's task awaits, and the dispatcher resolves (a future's
    two methods: an asyncio future is one)."""

    def set_result(self, result: None, /) -> None: ...

    def __await__(self) -> Generator[Any, Any, Any]: ...


class _EventGate:
    """A gate on anyio: an event, awaited as a future is."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set_result(self, result: None, /) -> None:
        self._event.set()

    def __await__(self) -> Generator[Any, Any, Any]:
        return self._event.wait().__await__()


class ScopedHandle:
    """A job's anyio task, as its runner sees it: its cancel scope. A lost
    lease then cancels a scope around the claimed run, since a scope's
    cancellation cannot be taken back (asyncio's ``Task.uncancel`` can)."""

    __slots__ = ("_scope",)

    def __init__(self, scope: anyio.CancelScope) -> None:
        self._scope = scope

    def cancel(self) -> None:
        self._scope.cancel()


# A job's task as its runner holds it: on asyncio the task itself (no object
# around it: 10,000 jobs would hold 10,000 of them, ~0.05 KiB each).
Handle = asyncio.Task[Any] | ScopedHandle
# Starts a job's task, given how its task parks: a future on asyncio, an
# event elsewhere.
Serve = Callable[[Callable[[], Gate]], Coroutine[Any, Any, None]]


class Bindable(Protocol):
    """What the backend needs of a job's runner (``JobRunner``)."""

    def bind(self, handle: Handle) -> None: ...


class Backend(Protocol):
    """How the jobs' tasks are made and held, and how a burst yields the loop."""

    checkpoint: Callable[[], Coroutine[Any, Any, None]]
    """A turn of the event loop."""

    def start(
        self,
        runner: Bindable,
        serve: Serve,
        name: str,
        context: contextvars.Context,
        ended: Callable[[BaseException | None], None],
    ) -> None:
        """Start ``serve(new_gate)`` as the task of ``runner`` (bound to its handle
        before it runs), in ``context``; ``ended`` is told when it ends, with
        its failure on asyncio (on anyio it goes up the task group)."""

    async def hold(self, until: anyio.Event, ready: Callable[[], None]) -> None:
        """Own the tasks until ``until`` is set (``ready``: tasks can start);
        cancelled meanwhile, take them along."""


class _Asyncio:
    """Plain asyncio tasks: the cheapest to start and to cancel."""

    __slots__ = ("_ended", "_gone", "_loop", "_new_gate", "_on_done", "_tasks")

    checkpoint = staticmethod(partial(asyncio.sleep, 0))

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._tasks: list[asyncio.Task[None]] = []
        # Tasks in the list that have ended (a stored schedule's, removed): the
        # list is pruned when they are half of it, else a task (~0.5 KiB with
        # its context) stayed for each job that ever ran while the jobs ran.
        self._gone = 0
        # Made once, not per job: a closure or bound method each is ~0.2 KiB a job.
        # asyncio's own loop makes a plain Future: made directly, without the
        # loop's Python method around it (a frame per park); a loop of its own
        # (uvloop, a test's) makes its futures as it likes.
        plain = getattr(type(loop), "create_future", None) is asyncio.BaseEventLoop.create_future
        self._new_gate: Callable[[], Gate] = (
            partial(asyncio.Future, loop=loop) if plain else loop.create_future
        )
        self._on_done = self._done
        self._ended: Callable[[BaseException | None], None] | None = None

    def start(
        self,
        runner: Bindable,
        serve: Serve,
        name: str,
        context: contextvars.Context,
        ended: Callable[[BaseException | None], None],
    ) -> None:
        # Named by the job's own name, no string made: 10,000 names of
        # "fastapi_jobs:<job>" were ~0.06 KiB a job. A task dump still says
        # whose it is: its coroutine is JobRunner.serve.
        task = self._loop.create_task(serve(self._new_gate), name=name, context=context)
        runner.bind(task)
        self._tasks.append(task)
        self._ended = ended  # the same for every job: the owner's
        # In the task's own context: without one, asyncio keeps a copy of the
        # current context per callback (~0.06 KiB a job).
        task.add_done_callback(self._on_done, context=context)

    def _done(self, task: asyncio.Task[None]) -> None:
        assert self._ended is not None
        self._ended(None if task.cancelled() else task.exception())
        self._gone += 1
        if self._gone > _KEEP_ENDED and 2 * self._gone > len(self._tasks):
            self._tasks = [task for task in self._tasks if not task.done()]
            self._gone = 0

    async def hold(self, until: anyio.Event, ready: Callable[[], None]) -> None:
        ready()
        try:
            await until.wait()
        except BaseException:
            # The owner itself is cancelled: take the tasks along.
            pending = [task for task in self._tasks if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(pending, timeout=_ABANDON_AFTER)
            raise


class _Anyio:
    """anyio tasks (trio), each in its own cancel scope, in one task group."""

    __slots__ = ("_tg",)

    checkpoint = staticmethod(anyio.lowlevel.checkpoint)

    def __init__(self) -> None:
        self._tg: anyio.abc.TaskGroup | None = None

    def start(
        self,
        runner: Bindable,
        serve: Serve,
        name: str,
        context: contextvars.Context,
        ended: Callable[[BaseException | None], None],
    ) -> None:
        assert self._tg is not None, "hold() calls ready() once its task group is open"
        # The new task copies the context it is started from: this one.
        tg = self._tg
        context.run(
            lambda: tg.start_soon(
                self._serve_in_scope, runner, serve, ended, name=f"fastapi_jobs:{name}"
            )
        )

    @staticmethod
    async def _serve_in_scope(
        runner: Bindable, serve: Serve, ended: Callable[[BaseException | None], None]
    ) -> None:
        try:
            with anyio.CancelScope() as scope:
                runner.bind(ScopedHandle(scope))
                await serve(_EventGate)
        finally:
            ended(None)

    async def hold(self, until: anyio.Event, ready: Callable[[], None]) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            ready()
            await until.wait()


def backend() -> Backend:
    """The running library's: asyncio's own primitives on asyncio, anyio's elsewhere."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return _Anyio()
    return _Asyncio(loop)
