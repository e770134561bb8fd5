"""A Celery worker for the hand-off tests:
``celery -A tests.apps.celery_worker worker -P solo -c 1 -Q <queue>``.

Its one task, ``fj.record`` (``bind=True``), appends what it was run with (its
``self.request.id`` and keyword arguments) to the Redis list
``executions:<queue>``: one entry per execution, duplicates included. Then it
does the work once per task id, as the docs tell a task to (``SET NX`` on the
id): ``work:<queue>`` gets one entry per id whose work ran. FJ_REDIS_SOCKET:
the server's unix socket; FJ_QUEUE: the queue it serves.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery  # type: ignore[import-untyped]

SOCKET = os.environ.get("FJ_REDIS_SOCKET", "/nonexistent")
QUEUE = os.environ.get("FJ_QUEUE", "celery")

app = Celery("fj_test_worker", broker=f"redis+socket://{SOCKET}")
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
# A message is taken off the queue when a worker gets it (Celery's default,
# said here): no redelivery adds duplicates of its own to what the tests count.
app.conf.task_acks_late = False

_redis = redis.Redis(unix_socket_path=SOCKET)


@app.task(name="fj.record", bind=True)  # type: ignore[untyped-decorator]
def record(self: Any, **kwargs: Any) -> None:
    task_id = self.request.id
    _redis.rpush(f"executions:{QUEUE}", json.dumps({"id": task_id, "kwargs": kwargs}))
    # The task's own dedupe on the tick's key: the work runs once per task id.
    if _redis.set(f"done:{QUEUE}:{task_id}", 1, nx=True):
        _redis.rpush(f"work:{QUEUE}", task_id)
