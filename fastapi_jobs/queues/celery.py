"""Hand ticks to `Celery <https://docs.celeryq.dev/>`_: `CeleryTask`.

Celery's brokers accept a second message under the same ``task_id`` (measured:
two sends, two executions), so the tick's key as the task id cannot make a
retry safe by itself. The store's outbox does: a send that went through is
recorded (``Outbox.sent``), and a retry or a peer sends nothing after it. What
is left is the window between a send and its record (a crash, a lost answer, a
timeout): the tick is sent again under the same task id, which the task checks.

Celery's send is synchronous and blocks on a broker that stopped answering
(forever without a socket timeout): it runs in a worker thread, abandoned after
``timeout``, and fails fast per call (no retries: the job's ``retries`` are
the retries, with the same key).
"""

from __future__ import annotations

import inspect
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from .._distribution import missing_extra
from .._errors import ConfigurationError, short
from . import HandoffRequest

try:
    from celery import Celery  # type: ignore[import-untyped]
    from kombu.exceptions import OperationalError  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise missing_extra("fastapi_jobs.queues.celery", "Celery", "celery", "celery") from exc

__all__ = ["CeleryTask"]

logger = logging.getLogger("fastapi_jobs.queues")

_FAIL_FAST = {"max_retries": 0}
"""Per send: one attempt. Celery's default retries a refused connection three
times; the run's own retries (with the same task id) are the ones that count."""

_READ_TIMEOUTS = ("socket_timeout", "read_timeout")
"""The broker_transport_options that bound a read: Redis's, RabbitMQ's (py-amqp)."""


class CeleryTask:
    """Each tick of a hand-off job becomes one Celery task ``name``, sent with
    the tick's key as its ``task_id``.

    ``name``: the task's registered name (``"tasks.send_digest"``); it is sent
    by name (``app.send_task``), so the app need not import the worker's code.
    ``app``: the ``celery.Celery`` to send with, or a function of the
    lifespan's state that returns it (``app=lambda state: state["celery"]``).
    ``queue``: the queue to route it to (default: Celery's routing).
    ``timeout``: seconds a send may take before the run fails (the send is then
    in doubt, and a retry sends it again under the same task id).

    With a store (its outbox), a tick recorded as sent is never sent again;
    without one, each run sends. The task gets the job's returned keyword
    arguments, and ``self.request.id`` (``bind=True``) is the tick's key.
    """

    __slots__ = ("_app", "_warned", "name", "queue", "task", "timeout")

    def __init__(
        self,
        name: str,
        *,
        app: Celery | Callable[[Mapping[str, Any]], Celery],
        queue: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"CeleryTask({short(name)}): pass the Celery task's registered name as a "
                'string, e.g. "tasks.send_digest" (the worker\'s @app.task(name=...))'
            )
        if not isinstance(app, Celery) and (not callable(app) or isinstance(app, type)):
            # Its type only: a broker URL passed here holds the password.
            what = f"the class {app.__name__}" if isinstance(app, type) else type(app).__name__
            raise ConfigurationError(
                f"CeleryTask({name!r}, app=<{what}>): pass a celery.Celery app or a plain "
                "function of the lifespan's state that returns one, e.g. "
                'app=lambda state: state["celery"]'
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf
        ):
            raise ConfigurationError(
                f"CeleryTask({name!r}, timeout={short(timeout)}): pass a finite number of "
                "seconds > 0 (Celery's send waits forever on a broker that stopped answering)"
            )
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise ConfigurationError(
                f"CeleryTask({name!r}, queue={short(queue)}): pass the name of a queue a "
                "worker consumes (celery worker -Q ...), or None for Celery's routing"
            )
        self.task = name
        self.name = f"celery task {name}"
        self.queue = queue
        self.timeout = float(timeout)
        self._app = app
        self._warned = False

    def __repr__(self) -> str:
        return f"CeleryTask({self.task!r}, queue={self.queue!r})"

    async def enqueue(self, request: HandoffRequest) -> str:
        """Send the task as Celery task ``request.key``, unless the outbox
        records it sent; its task id either way."""
        app = self._celery(request.state)  # a wrong app= fails before the store is written
        outbox = request.outbox
        if outbox is not None and request.maybe_sent:
            # Only a retry, or a tick claimed again after its claimer died, may
            # find it sent: the first attempt of a fresh claim needs no lookup.
            recorded = await outbox.sending(request.job, request.tick, self.name)
            if recorded is not None:
                return recorded  # a retry's, or a peer's: sent before
        if "self" in request.kwargs:
            raise TypeError(
                "the task's keyword argument 'self' is the bound task's own (bind=True, "
                "self.request.id is the tick's key): rename it"
            )
        task_id = await self._send(app, request.key, dict(request.kwargs))
        if outbox is not None:
            # A crash (or a store failure) before this leaves the tick to be sent
            # again under the same task id: the window the docs tell the task of.
            try:
                await outbox.sent(request.job, request.tick, self.name, task_id)
            except Exception as exc:  # noqa: BLE001 - the tick is in the broker: the run is ok
                logger.warning(
                    "%s: sent %r, but the store could not record it (%r): a retry of the "
                    "tick, or a peer that claims it again, sends it again under the same "
                    "task_id",
                    self.name,
                    task_id,
                    exc,
                )
        return task_id

    def _celery(self, state: Mapping[str, Any]) -> Celery:
        app = self._app if isinstance(self._app, Celery) else self._app(state)
        if not isinstance(app, Celery):
            if inspect.iscoroutine(app):
                app.close()  # an async app function's: never awaited, and no warning for it
            raise TypeError(
                f"CeleryTask({self.task!r}): app= returned <a {type(app).__name__}>, not a "
                "celery.Celery: make it a plain (not async) function of the lifespan's "
                "state that returns the app's Celery"
            )
        if not self._warned:
            self._warned = True
            options = app.conf.broker_transport_options or {}
            if not any(options.get(option) for option in _READ_TIMEOUTS):
                warnings.warn(
                    f"{self.name}: the Celery app's broker_transport_options set no read "
                    'timeout ({"socket_timeout": 1} for Redis, {"read_timeout": 1} for '
                    "RabbitMQ): a broker that stops answering then holds each send's thread "
                    "forever (the run fails after timeout=, the thread stays)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return app

    async def _send(self, app: Celery, key: str, kwargs: dict[str, Any]) -> str:
        def send() -> str:
            result = app.send_task(
                self.task,
                kwargs=kwargs,
                task_id=key,
                queue=self.queue,
                retry_policy=_FAIL_FAST,
                add_to_parent=False,
            )
            return str(result.id)

        try:
            # A thread cannot be cancelled: past the timeout it is abandoned, and
            # ends when the broker answers (or its socket timeout fires).
            with anyio.move_on_after(self.timeout):
                return await anyio.to_thread.run_sync(send, abandon_on_cancel=True)
        except OperationalError as exc:
            raise ConnectionError(
                f"Celery could not send {key!r}: the broker is down or not answering "
                f"({type(exc).__name__}: {exc}); a retry of the tick sends it under the "
                "same task_id"
            ) from exc
        # In doubt: the message may be in the broker. Not recorded as sent, so a
        # retry sends it again, under the same task id.
        raise TimeoutError(
            f"Celery's broker did not answer within {self.timeout:g}s sending {key!r} (is "
            "it up and answering?); a retry of the tick sends it again under the same "
            "task_id"
        )
