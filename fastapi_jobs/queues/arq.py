"""Hand ticks to `arq <https://arq-docs.helpmanual.io/>`_: `ArqTask`.

arq refuses a second ``enqueue_job`` with the same ``_job_id`` while the job is
queued, while it runs, and for the worker's ``keep_result`` seconds after it
ends (WATCH/MULTI, atomic across processes): the tick's key as the job id makes
a retry, or a second instance's enqueue, a refused duplicate. arq keeps every
job id of a Redis in one namespace (``arq:job:<id>``), whatever the queue, so
on a queue other than arq's default the id carries the queue's name: two apps
with a job of one name on two queues must not refuse each other's ticks. arq
waits for a Redis that accepted the connection and stopped answering forever,
so every enqueue here is bounded (``timeout``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from .._distribution import missing_extra
from .._errors import ConfigurationError, short
from . import HandoffRequest

try:
    from arq.connections import ArqRedis
    from arq.constants import default_queue_name
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise missing_extra("fastapi_jobs.queues.arq", "arq", "arq", "arq") from exc

__all__ = ["ArqTask"]

_ARQS_OWN = frozenset(
    name
    for name, parameter in inspect.signature(ArqRedis.enqueue_job).parameters.items()
    if parameter.kind is not parameter.VAR_KEYWORD
    and parameter.kind is not parameter.VAR_POSITIONAL
) | {"ctx"}
"""Names a task's keyword argument cannot have: ``enqueue_job``'s own parameters
(``function``, ``_job_id``, ``_defer_by``, ``_expires``, …), which arq would read
as its options rather than pass on (a ``_job_id`` of the job's would replace the
tick's key), and ``ctx``, what arq passes every task first."""


class ArqTask:
    """Each tick of a hand-off job becomes one run of arq task ``function``.

    ``pool``: the ``ArqRedis`` to enqueue with (``await arq.create_pool(...)``),
    or a function of the lifespan's state that returns it (when the app makes
    its pool in its lifespan: ``pool=lambda state: state["arq"]``).
    ``queue_name``: arq's ``_queue_name`` (default: arq's default queue).
    ``timeout``: seconds an enqueue may take before the run fails.

    The task runs with the job's returned keyword arguments, and
    ``ctx["job_id"]`` is the tick's key (``"digest@2025-01-01T00:00:00Z"``) on
    arq's default queue, ``"<queue_name>:<key>"`` on another (see `job_id`).
    """

    __slots__ = ("_pool", "function", "name", "queue_name", "timeout")

    def __init__(
        self,
        function: str,
        *,
        pool: ArqRedis | Callable[[Mapping[str, Any]], ArqRedis],
        queue_name: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        if not isinstance(function, str) or not function:
            raise ConfigurationError(
                f"ArqTask({short(function)}): pass the arq task's name as a string, "
                "as the worker's WorkerSettings.functions register it"
            )
        if not isinstance(pool, ArqRedis) and (not callable(pool) or isinstance(pool, type)):
            # Its type only: a DSN or settings object passed here holds the password.
            what = f"the class {pool.__name__}" if isinstance(pool, type) else type(pool).__name__
            raise ConfigurationError(
                f"ArqTask({function!r}, pool=<{what}>): pass an ArqRedis "
                "(await arq.create_pool(...)) or a plain function of the lifespan's state "
                'that returns one, e.g. pool=lambda state: state["arq"]'
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf
        ):
            raise ConfigurationError(
                f"ArqTask({function!r}, timeout={short(timeout)}): pass a finite number of "
                "seconds > 0 (arq waits forever on a Redis that stopped answering)"
            )
        if queue_name is not None and (not isinstance(queue_name, str) or not queue_name):
            raise ConfigurationError(
                f"ArqTask({function!r}, queue_name={short(queue_name)}): pass the name of a "
                "queue a worker reads (WorkerSettings.queue_name), or None for arq's default"
            )
        self.function = function
        self.name = f"arq task {function}"
        self.queue_name = queue_name
        self.timeout = float(timeout)
        self._pool = pool

    def __repr__(self) -> str:
        return f"ArqTask({self.function!r}, queue_name={self.queue_name!r})"

    def job_id(self, key: str) -> str:
        """The arq job id of the tick whose key is ``key``: the key on arq's
        default queue, ``"<queue_name>:<key>"`` on another. arq's job ids are one
        namespace per Redis, whatever the queue: two apps with a job of one name,
        on two queues, would otherwise refuse each other's ticks as duplicates."""
        queue = self.queue_name
        return key if queue is None or queue == default_queue_name else f"{queue}:{key}"

    async def enqueue(self, request: HandoffRequest) -> str:
        """Enqueue the task as arq job `job_id` of ``request.key``: its id, also
        when arq already had it (a duplicate refused is a tick in the queue)."""
        key, kwargs = self.job_id(request.key), request.kwargs
        taken = sorted(_ARQS_OWN.intersection(kwargs))
        if taken:
            raise TypeError(
                f"the task's keyword argument(s) {', '.join(taken)} are arq's own (options "
                "of enqueue_job, or the ctx it passes every task): rename them (the tick's "
                "key is the job id)"
            )
        pool = self._pool if isinstance(self._pool, ArqRedis) else self._pool(request.state)
        if not isinstance(pool, ArqRedis):
            if inspect.iscoroutine(pool):
                pool.close()  # an async pool function's: never awaited, and no warning for it
            raise TypeError(
                f"ArqTask({self.function!r}): pool= returned <a {type(pool).__name__}>, not "
                "an ArqRedis: make it a plain (not async) function of the lifespan's state "
                "that returns the app's pool"
            )
        with anyio.move_on_after(self.timeout) as scope:
            await pool.enqueue_job(
                self.function, _job_id=key, _queue_name=self.queue_name, **kwargs
            )
        if scope.cancelled_caught:
            # In doubt: the job may be in Redis. The retry uses the same key, and
            # arq refuses it if the first went through.
            raise TimeoutError(
                f"arq did not answer within {self.timeout:g}s enqueuing {key!r} (is Redis "
                "up and answering?); a retry of the tick uses the same job id"
            )
        return key
