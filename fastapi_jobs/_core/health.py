"""Whether the store answers this instance: `StoreHealth`.

A store that fails now and then costs a tick here and there, each one skipped,
counted and logged (fail closed). A store that fails every call is another
matter: the app stays up and serves requests while no claimed job runs on it.
The platform that runs the app must be able to see that (`Scheduler.health`,
``health_router``), and the operator must read it at ERROR, once, not only as
skip counts.

Two kinds of calls are watched apart, each from its first failure after its
last success: the claims (every due tick sends one) and the heartbeats (every
``heartbeat`` seconds, due ticks or not). Either failing for longer than the
store's lease is the store failing: by then a peer has taken over this
instance's claims, and a run here could not keep its own. A configuration the
store refuses (`ConfigurationError`: a pooler it cannot run behind) never
mends by itself, so it counts as failing at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import anyio

from .._errors import ConfigurationError
from .._status import ErrorInfo, Health, SchedulerState

__all__ = ["Call", "StoreHealth", "health_of"]

Call = Literal["claims", "heartbeats"]
"""The store's calls watched: claims (each due tick's) and heartbeats."""


class StoreHealth:
    """Whether ``Call``s to the store fail: for each kind, the first and the
    latest failure since its last success. Failing once failures of one kind
    span more than ``lease`` (at once for a refused configuration): said once
    at ERROR, and once when they mend. A single failure is no outage however
    long the next call of its kind is in coming (an hourly job's claim)."""

    def __init__(
        self,
        logger: logging.Logger,
        lease: float,
        now: Callable[[], float] = anyio.current_time,
    ) -> None:
        self.logger = logger
        self.lease = lease
        self._now = now
        self._streaks: dict[Call, tuple[float, float]] = {}  # first and latest failure
        self._refused = False  # a failure that never mends (a ConfigurationError)
        self._told = False  # the ERROR line was written for the current failure
        # As shown: the exception would keep its traceback's frames alive.
        self.last_error: ErrorInfo | None = None

    def ok(self, call: Call) -> None:
        """A call of this kind went through: it fails no more."""
        if self._streaks.pop(call, None) is None:
            return
        if not self._streaks:
            self._refused = False
        if self._told and self.failing_for() is None:
            self._told = False
            self.logger.warning("the store answers again: claimed jobs run on this instance")

    def failed(self, call: Call, error: BaseException) -> None:
        """A call of this kind failed with ``error``."""
        now = self._now()
        first, _ = self._streaks.get(call, (now, now))
        self._streaks[call] = first, now
        self.last_error = ErrorInfo.of(error)
        if isinstance(error, ConfigurationError):
            self._refused = True
        failing = self.failing_for()
        if not self._told and failing is not None:
            self._told = True
            self.logger.error(
                "the store has failed every %s for %.0fs (more than its lease, %gs): "
                "no claimed job runs on this instance until it answers; the last error: %s",
                "claim" if call == "claims" else "heartbeat",
                failing,
                self.lease,
                error if isinstance(error, ConfigurationError) else repr(error),
            )

    def failing_for(self) -> float | None:
        """How long the calls have failed, once that is too long (failures of
        one kind over more than the lease, or a refused configuration at once);
        else None."""
        spans = [
            first
            for first, latest in self._streaks.values()
            if self._refused or latest - first > self.lease
        ]
        return None if not spans else self._now() - min(spans)


def health_of(state: SchedulerState, store: StoreHealth | None, lease: float | None) -> Health:
    """The `Health` of a scheduler in ``state``, whose store (if it has one) is
    ``store`` while it runs."""
    if state != "running":
        detail = (
            "the app has not started the scheduler: write FastAPI(lifespan=scheduler.lifespan)"
            if state == "never_started"
            else "the scheduler has stopped: the app is shutting down"
        )
        return Health(ok=False, status="not_running", detail=detail, scheduler=state, lease_s=lease)
    failing = None if store is None else store.failing_for()
    if store is None or failing is None:
        return Health(ok=True, status="ok", detail="the scheduler runs", lease_s=lease)
    error = "" if store.last_error is None else f" ({store.last_error.type})"
    return Health(
        ok=False,
        status="store_failing",
        detail=f"the store has failed every call for {failing:.0f}s{error}: no claimed job "
        "runs on this instance; the log says why at ERROR",
        store_failing_for_s=round(failing, 3),
        lease_s=lease,
    )
