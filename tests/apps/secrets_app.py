"""An app whose schedules carry secrets in their kwargs, for the test that no
output shows them (tests/project/test_secrets.py): ``make(url)`` builds one on
the store at ``url``; that test points ``app`` at its own for the command line
(``tests.apps.secrets_app:app``) in its process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI

from fastapi_jobs import Scheduler
from fastapi_jobs.queues import HandoffRequest
from fastapi_jobs.stores import SQLAlchemyStore

app: FastAPI | None = None
"""The app the command line opens: set by the test to one of ``make``'s."""


class Queue:
    """A hand-off's queue that keeps what it was given, as a queue library's
    client would log it (its repr); ``returns``: what the job ``bad_handoff``
    returns (anything but a dict is refused, quoted in the run's error)."""

    name = "kept queue"

    def __init__(self) -> None:
        self.given: list[str] = []
        self.returns: object = None

    async def enqueue(self, request: HandoffRequest) -> str:
        self.given.append(repr(request))
        return request.key


def make(url: str, secrets: Mapping[str, Any]) -> tuple[Scheduler, FastAPI, Queue, list[Any]]:
    """The scheduler on ``url``'s store; its app (the status, control and
    health routers); the queue of its hand-off jobs (``handoff`` hands
    ``secrets`` on, ``bad_handoff`` the queue's ``returns``); and the kwargs
    each run of the task ``sync`` got (it fails each time, saying nothing of
    them)."""
    scheduler = Scheduler(store=SQLAlchemyStore(url), shutdown_timeout=2)
    got: list[Any] = []
    queue = Queue()

    @scheduler.task()
    async def sync(**kwargs: Any) -> None:
        got.append(kwargs)
        raise ConnectionError("the source refused the login")

    scheduler.every(hours=240, name="handoff", enqueue=queue)(lambda: dict(secrets))
    scheduler.every(hours=240, name="bad_handoff", enqueue=queue)(lambda: queue.returns)
    made = FastAPI(lifespan=scheduler.lifespan)
    made.include_router(scheduler.router)
    made.include_router(scheduler.control_router(public=True))
    made.include_router(scheduler.health_router())
    return scheduler, made, queue, got
