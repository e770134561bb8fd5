"""An app for the multi-process Celery hand-off tests: one hand-off job to Celery.

Configured by the environment: DATABASE_URL, FJ_REDIS_SOCKET (the broker's unix
socket), FJ_QUEUE (the queue tests/apps/celery_worker.py serves), INTERVAL (s),
LEASE (s), BLOCK (a file's path) and BLOCK_AT: ``claim`` (after the claim,
before the adapter), ``send`` (after the send, before the outbox records it) or
``record`` (after the record, before the release).

The first instance to find the file BLOCK as it hands a tick off takes it
(renames it to ``BLOCK.taken``: one instance wins), writes there its pid and the
tick's key, and then blocks for good at BLOCK_AT: the test SIGKILLs it there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
from celery import Celery  # type: ignore[import-untyped]
from fastapi import FastAPI

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs.queues import HandoffRequest, Outbox
from fastapi_jobs.queues.celery import CeleryTask
from fastapi_jobs.stores import SQLAlchemyStore

logging.basicConfig(level=logging.INFO)
ENV = os.environ
BLOCK, AT = ENV.get("BLOCK"), ENV.get("BLOCK_AT", "claim")


def _take(key: str) -> bool:
    if BLOCK is None:
        return False
    try:
        os.rename(BLOCK, f"{BLOCK}.taken")  # atomic: one instance wins
    except FileNotFoundError:
        return False
    Path(f"{BLOCK}.taken").write_text(f"{os.getpid()} {key}")
    return True


class HeldOutbox:
    """The store's outbox, whose record of the send blocks for good (``send``)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox, self.dialect, self.lease = outbox, outbox.dialect, outbox.lease

    async def once(self, *args: Any) -> tuple[str, bool]:
        return await self.outbox.once(*args)

    async def sending(self, job: str, tick: datetime, queue: str) -> str | None:
        return await self.outbox.sending(job, tick, queue)

    async def queue_ids(
        self, ticks: Sequence[tuple[str, float]]
    ) -> Mapping[tuple[str, float], str]:
        return await self.outbox.queue_ids(ticks)

    async def sent(self, job: str, tick: datetime, queue: str, queue_id: str) -> None:
        await anyio.Path(f"{BLOCK}.sent").write_text(queue_id)
        await anyio.sleep_forever()


class BlockingOnce:
    """The real Celery hand-off, with one instance's one tick held for good."""

    def __init__(self, task: CeleryTask) -> None:
        self.task, self.name = task, task.name

    async def enqueue(self, request: HandoffRequest) -> str:
        taken = _take(request.key)
        if taken and AT == "claim":
            await anyio.sleep_forever()
        if taken and AT == "send" and request.outbox is not None:
            request = replace(request, outbox=HeldOutbox(request.outbox))
        task_id = await self.task.enqueue(request)
        if taken:
            await anyio.Path(f"{BLOCK}.recorded").write_text(task_id)
            await anyio.sleep_forever()
        return task_id


@asynccontextmanager
async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    celery = Celery("fj_cluster", broker=f"redis+socket://{ENV['FJ_REDIS_SOCKET']}")
    celery.conf.broker_transport_options = {"socket_timeout": 1, "socket_connect_timeout": 1}
    celery.conf.broker_connection_timeout = 1
    try:
        yield {"celery": celery}
    finally:
        celery.close()


scheduler = Scheduler(
    lifespan=resources,
    store=SQLAlchemyStore(
        ENV["DATABASE_URL"],
        lease=float(ENV.get("LEASE", "2")),
        timeout=float(ENV.get("TIMEOUT", "0.6")),
        heartbeat=1,
    ),
    shutdown_timeout=2,
)
task = CeleryTask("fj.record", app=lambda state: state["celery"], queue=ENV["FJ_QUEUE"])


@scheduler.every(seconds=float(ENV.get("INTERVAL", "3")), enqueue=BlockingOnce(task))
async def digest(ctx: JobContext) -> dict[str, object]:
    return {"tick": ctx.tick.isoformat()}


app = FastAPI(lifespan=scheduler.lifespan)
