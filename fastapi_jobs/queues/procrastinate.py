"""Hand ticks to `procrastinate <https://procrastinate.readthedocs.io/>`_: `ProcrastinateTask`.

procrastinate's queue is a table in PostgreSQL. When it is the app's own
database (the store's), the job's row and the store's outbox row for the tick
commit in one transaction (``Outbox.once``): a tick is in the queue exactly
once, whoever retries it and whatever dies when. procrastinate's own refusal
(``queueing_lock``) lasts only while a job waits, and its ``AlreadyEnqueued``
would abort that transaction: it is never set here.

The job is inserted with procrastinate's own SQL function, the one its
``defer_async`` calls (``procrastinate_defer_jobs_v1``, since 3.2), on the
store's connection. One statement through SQLAlchemy works the same on asyncpg
and psycopg (``task.configure(connection=)`` takes a psycopg connection only),
needs no procrastinate ``App`` or connector in the app, and costs one round
trip. The function is versioned: the extra pins procrastinate's major version.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from .._checks import is_whole
from .._distribution import missing_extra
from .._errors import ConfigurationError, short
from . import HandoffRequest, Outbox

try:
    from procrastinate.tasks import Task
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise missing_extra(
        "fastapi_jobs.queues.procrastinate", "procrastinate", "procrastinate", "procrastinate"
    ) from exc

__all__ = ["ProcrastinateTask"]

_DEFER = sa.text(
    "SELECT unnest(procrastinate_defer_jobs_v1(ARRAY[ROW(:queue, :task, :priority, :lock, "
    "NULL, CAST(:args AS jsonb), NULL)]::procrastinate_job_to_defer_v1[])) AS id"
).columns(sa.column("id", sa.BigInteger))
"""One job, as procrastinate's ``defer_async`` inserts it: no queueing lock, due now."""

_NO_SCHEMA = {"42883", "42704"}  # undefined_function, undefined_object (the row type)

_NEEDS = (
    "needs Scheduler(store=SQLAlchemyStore(<the PostgreSQL database that holds "
    "procrastinate's schema>)): the job's row commits with the store's record of the tick"
)


class ProcrastinateTask:
    """Each tick of a hand-off job becomes one job of procrastinate task ``task``,
    inserted in the store's database in the transaction that records the tick.

    ``task``: the task (what ``@app.task(...)`` returns: its name, queue,
    priority and lock are the defaults), or its name (then the queue is
    procrastinate's ``"default"`` unless ``queue=`` says otherwise).
    ``queue``, ``priority``, ``lock``: procrastinate's, overriding the task's.

    The task runs with the job's returned keyword arguments, nothing added:
    return the tick (``ctx.tick.isoformat()``) or its key
    (``fastapi_jobs.queues.handoff_key``) among them if the task needs it.
    The queue's job id is procrastinate's (``context.job.id``).
    """

    __slots__ = ("lock", "name", "priority", "queue", "task_name")

    def __init__(
        self,
        task: Task[Any, Any, Any] | str,
        *,
        queue: str | None = None,
        priority: int | None = None,
        lock: str | None = None,
    ) -> None:
        if isinstance(task, Task):
            if task.queueing_lock is not None:
                raise ConfigurationError(
                    f"ProcrastinateTask({task.name!r}): the task has a queueing_lock, which "
                    "a hand-off never sets (its AlreadyEnqueued would abort the transaction "
                    "that records the tick; the store's record already makes each tick "
                    "once): declare the task without queueing_lock="
                )
            name, defaults = task.name, (task.queue, task.priority, task.lock)
        elif isinstance(task, str) and task:
            name, defaults = task, ("default", 0, None)
        else:
            raise ConfigurationError(
                f"ProcrastinateTask({short(task)}): pass the procrastinate task "
                "(what @app.task(...) returns) or its name as a string"
            )
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise ConfigurationError(
                f"ProcrastinateTask({name!r}, queue={short(queue)}): pass the name of a "
                "queue a worker reads, or None for the task's"
            )
        # procrastinate_jobs.priority is an integer (PostgreSQL's).
        if priority is not None and not is_whole(priority, -(2**31), 2**31 - 1):
            raise ConfigurationError(
                f"ProcrastinateTask({name!r}, priority={short(priority)}): pass an int "
                "(higher runs first; PostgreSQL's integer range), or None for the task's"
            )
        if lock is not None and (not isinstance(lock, str) or not lock):
            raise ConfigurationError(
                f"ProcrastinateTask({name!r}, lock={short(lock)}): pass a lock name (jobs "
                "with the same lock run one at a time), or None for the task's"
            )
        self.task_name = name
        self.name = f"procrastinate task {name}"
        self.queue: str = queue if queue is not None else defaults[0]
        self.priority: int = priority if priority is not None else defaults[1]
        self.lock: str | None = lock if lock is not None else defaults[2]

    def __repr__(self) -> str:
        return f"ProcrastinateTask({self.task_name!r}, queue={self.queue!r})"

    async def enqueue(self, request: HandoffRequest) -> str:
        """Insert the job with the store's record of ``request``'s tick, in one
        transaction; its procrastinate job id, also when the tick was handed
        off before (then nothing is inserted)."""
        outbox = _outbox(self.task_name, request.outbox)
        params = {
            "queue": self.queue,
            "task": self.task_name,
            "priority": self.priority,
            "lock": self.lock,
            "args": json.dumps(dict(request.kwargs), allow_nan=False),
        }

        defer = _DEFER.bindparams(**params)
        try:
            job_id, _ = await outbox.once(request.job, request.tick, self.name, defer)
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) in _NO_SCHEMA:
                raise RuntimeError(
                    f"the store's database has no procrastinate schema (or one older "
                    f"than 3.2): apply it there (procrastinate schema --apply, with the "
                    f"app's connector on that database), or give {self.name} a store "
                    "on the database that holds it"
                ) from None
            raise
        except TimeoutError:
            # The store's operation deadline (twice its timeout) ended the
            # transaction: the tick is recorded with its job, or neither is.
            raise TimeoutError(
                f"the store's database did not take {request.key!r} for {self.name} within "
                "its deadline (twice the store's timeout; is procrastinate_jobs locked, or "
                "the database overloaded?): the tick's job and its record commit together "
                "or not at all, and a retry inserts it once"
            ) from None
        return job_id


def _outbox(task: str, outbox: Outbox | None) -> Outbox:
    if outbox is None:
        raise RuntimeError(f"a hand-off to procrastinate task {task!r} {_NEEDS}")
    if outbox.dialect != "postgresql":
        raise RuntimeError(
            f"a hand-off to procrastinate task {task!r} {_NEEDS}; this store is on "
            f"{outbox.dialect or 'a database not open yet'}"
        )
    return outbox
