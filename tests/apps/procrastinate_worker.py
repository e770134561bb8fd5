"""A procrastinate worker for the hand-off tests:
``procrastinate --app=tests.apps.procrastinate_worker.app worker``.

Its one task, ``record``, inserts what it was run with (its procrastinate job
id, its keyword arguments) into the table ``executions`` of the database it
serves, which the test reads: one row per execution. FJ_PG_DSN: that database
(a libpq conninfo or URL, for psycopg).
"""

from __future__ import annotations

import json
import os
from typing import Any

from procrastinate import App, JobContext, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=os.environ.get("FJ_PG_DSN", "")))


@app.task(name="record", pass_context=True)
async def record(context: JobContext, /, **kwargs: Any) -> None:
    assert context.job.id is not None
    await app.connector.execute_query_async(
        "INSERT INTO executions (job_id, kwargs) VALUES (%(job_id)s, %(kwargs)s::jsonb)",
        job_id=context.job.id,
        kwargs=json.dumps(kwargs),
    )
