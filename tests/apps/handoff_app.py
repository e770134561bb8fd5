"""An app for the multi-process hand-off tests: one hand-off job to arq.

Configured by the environment: DATABASE_URL, FJ_REDIS_SOCKET (the Redis
server's unix socket), FJ_QUEUE (the arq queue; tests/apps/arq_worker.py
serves it), INTERVAL (s), LEASE (s), TIMEOUT (s), BLOCK (a file's path) and
BLOCK_AT (``before`` or ``after`` the enqueue).

The first instance to find the file BLOCK as it hands a tick off takes it
(renames it to ``BLOCK.taken``: one instance wins), writes there its pid and the
tick's key, and then blocks for good, before delegating to arq or after: the
test SIGKILLs it there, between its claim and its enqueue, or between its
enqueue and its release.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from arq import create_pool
from arq.connections import RedisSettings
from fastapi import FastAPI

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs.queues import HandoffRequest
from fastapi_jobs.queues.arq import ArqTask
from fastapi_jobs.stores import SQLAlchemyStore

logging.basicConfig(level=logging.INFO)
ENV = os.environ


class BlockingOnce:
    """The real arq hand-off, with one instance's one enqueue held for good."""

    def __init__(self, task: ArqTask, block: str | None, at: str) -> None:
        self.task, self.name = task, task.name
        self.block, self.at = block, at

    async def enqueue(self, request: HandoffRequest) -> str:
        key = request.key
        taken = self._take(key)
        if taken and self.at == "before":
            await anyio.sleep_forever()
        job_id = await self.task.enqueue(request)
        if taken:
            await anyio.Path(f"{self.block}.enqueued").write_text(key)
            await anyio.sleep_forever()
        return job_id

    def _take(self, key: str) -> bool:
        if self.block is None:
            return False
        try:
            os.rename(self.block, f"{self.block}.taken")  # atomic: one instance wins
        except FileNotFoundError:
            return False
        Path(f"{self.block}.taken").write_text(f"{os.getpid()} {key}")
        return True


@asynccontextmanager
async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    pool = await create_pool(RedisSettings(unix_socket_path=ENV["FJ_REDIS_SOCKET"]))
    try:
        yield {"arq": pool}
    finally:
        await pool.aclose()


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
task = ArqTask("record", pool=lambda state: state["arq"], queue_name=ENV["FJ_QUEUE"])
handoff = BlockingOnce(task, ENV.get("BLOCK"), ENV.get("BLOCK_AT", "before"))


@scheduler.every(seconds=float(ENV.get("INTERVAL", "3")), enqueue=handoff)
async def digest(ctx: JobContext) -> dict[str, object]:
    return {"tick": ctx.tick.isoformat()}


app = FastAPI(lifespan=scheduler.lifespan)
