"""Hand ticks to `arq <https://arq-docs.helpmanual.io/>`_: `ArqTask`.

arq refuses a second ``enqueue_job`` with the same ``_job_id`` while the job is
queued, while it runs, and for the worker's ``keep_result`` seconds after it
ends (WATCH/MULTI, atomic across processes): the tick's key as the job id makes
a retry, or a second instance's enqueue, a refused duplicate. arq waits for a
Redis that accepted the connection and stopped answering forever, so every
enqueue here is bounded (``timeout``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import anyio

from .._distribution import NAME, install_hint
from .._errors import ConfigurationError, short

try:
    from arq.connections import ArqRedis
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"fastapi_jobs.queues.arq needs arq: install {NAME} with its extra [arq], "
        f"{install_hint('arq')}, or arq yourself"
    ) from exc

__all__ = ["ArqTask"]

_ARQS_OWN = frozenset(
    name
    for name, parameter in inspect.signature(ArqRedis.enqueue_job).parameters.items()
    if parameter.kind is parameter.KEYWORD_ONLY
)
"""``enqueue_job``'s own options (``_job_id``, ``_defer_by``, ``_expires``, …): a
job's kwarg of that name would be read by arq as the option, not passed to the
task (a ``_job_id`` of the job's would replace the tick's key)."""


class ArqTask:
    """Each tick of a hand-off job becomes one run of arq task ``function``.

    ``pool``: the ``ArqRedis`` to enqueue with (``await arq.create_pool(...)``),
    or a function of the lifespan's state that returns it (when the app makes
    its pool in its lifespan: ``pool=lambda state: state["arq"]``).
    ``queue_name``: arq's ``_queue_name`` (default: arq's default queue).
    ``timeout``: seconds an enqueue may take before the run fails.

    The task runs with the job's returned keyword arguments, and
    ``ctx["job_id"]`` is the tick's key (``"digest@2025-01-01T00:00:00Z"``).
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
        if not isinstance(pool, ArqRedis) and not callable(pool):
            raise ConfigurationError(
                f"ArqTask({function!r}, pool={short(pool)}): pass an ArqRedis "
                "(await arq.create_pool(...)) or a function of the lifespan's state that "
                'returns one, e.g. pool=lambda state: state["arq"]'
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigurationError(
                f"ArqTask({function!r}, timeout={short(timeout)}): pass a number of seconds > 0"
            )
        self.function = function
        self.name = f"arq task {function}"
        self.queue_name = queue_name
        self.timeout = float(timeout)
        self._pool = pool

    def __repr__(self) -> str:
        return f"ArqTask({self.function!r}, queue_name={self.queue_name!r})"

    async def enqueue(
        self, key: str, tick: datetime, kwargs: Mapping[str, Any], state: Mapping[str, Any]
    ) -> str:
        """Enqueue the task as arq job ``key``: its id, also when arq already
        had it (a duplicate refused is a tick in the queue)."""
        taken = sorted(_ARQS_OWN.intersection(kwargs))
        if taken:
            raise TypeError(
                f"the task's keyword argument(s) {', '.join(taken)} are arq's own options of "
                f"enqueue_job, not the task's: rename them (the tick's key is the job id)"
            )
        pool = self._pool if isinstance(self._pool, ArqRedis) else self._pool(state)
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
