"""An arq worker for the hand-off tests: ``python -m arq tests.apps.arq_worker.WorkerSettings``.

Its one task, ``record``, appends what it was run with (its arq job id, the
tick's key in it, its keyword arguments, the try) to the Redis list
``executions:<queue>``, which the test reads: one entry per execution.
FJ_REDIS_SOCKET: the server's unix socket; FJ_QUEUE: the arq queue it serves.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

from arq.connections import RedisSettings

QUEUE = os.environ.get("FJ_QUEUE", "arq:queue")


async def record(ctx: dict[str, Any], **kwargs: Any) -> None:
    job_id = ctx["job_id"]
    # On a queue of its own, the job id is "<queue>:<key>" (ArqTask.job_id).
    key = job_id.removeprefix(f"{QUEUE}:") if QUEUE != "arq:queue" else job_id
    entry = {"job_id": job_id, "key": key, "kwargs": kwargs, "try": ctx["job_try"]}
    await ctx["redis"].rpush(f"executions:{QUEUE}", json.dumps(entry))


class WorkerSettings:
    functions: ClassVar[list[Any]] = [record]
    queue_name = QUEUE
    redis_settings = RedisSettings(unix_socket_path=os.environ.get("FJ_REDIS_SOCKET"))
    poll_delay = 0.05
    keep_result = 3600  # arq's default, said here: the window in which a duplicate is refused
