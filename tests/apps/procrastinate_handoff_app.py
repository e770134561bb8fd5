"""An app for the multi-process procrastinate hand-off tests: one hand-off job
to procrastinate task ``record`` (tests/apps/procrastinate_worker.py runs it),
its store on the database that holds procrastinate's schema.

Configured by the environment: DATABASE_URL, INTERVAL (s), LEASE (s), TIMEOUT
(s), BLOCK (a file's path) and BLOCK_AT (``before`` or ``after`` the enqueue).

The first instance to find the file BLOCK as it hands a tick off takes it
(renames it to ``BLOCK.taken``: one instance wins), writes there its pid and the
tick's key, and then blocks for good, before the enqueue or after it (the job
row and the outbox row committed): the test SIGKILLs it there, between its
claim and its enqueue, or between its enqueue and its release.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import anyio
from fastapi import FastAPI

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs.queues import HandoffRequest
from fastapi_jobs.queues.procrastinate import ProcrastinateTask
from fastapi_jobs.stores import SQLAlchemyStore

logging.basicConfig(level=logging.INFO)
ENV = os.environ


class BlockingOnce:
    """The real procrastinate hand-off, with one instance's one enqueue held for good."""

    def __init__(self, task: ProcrastinateTask, block: str | None, at: str) -> None:
        self.task, self.name = task, task.name
        self.block, self.at = block, at

    async def enqueue(self, request: HandoffRequest) -> str:
        taken = self._take(request.key)
        if taken and self.at == "before":
            await anyio.sleep_forever()
        job_id = await self.task.enqueue(request)
        if taken:
            await anyio.Path(f"{self.block}.enqueued").write_text(job_id)
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


scheduler = Scheduler(
    store=SQLAlchemyStore(
        ENV["DATABASE_URL"],
        lease=float(ENV.get("LEASE", "2")),
        timeout=float(ENV.get("TIMEOUT", "0.6")),
        heartbeat=1,
    ),
    shutdown_timeout=2,
)
handoff = BlockingOnce(ProcrastinateTask("record"), ENV.get("BLOCK"), ENV.get("BLOCK_AT", "before"))


@scheduler.every(seconds=float(ENV.get("INTERVAL", "3")), enqueue=handoff)
async def digest(ctx: JobContext) -> dict[str, object]:
    return {"tick": ctx.tick.isoformat()}


app = FastAPI(lifespan=scheduler.lifespan)
