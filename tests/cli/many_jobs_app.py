"""An app that declares 2,000 jobs (no store), every tenth paused: the list
command's filters and pages over them."""

from __future__ import annotations

from fastapi import FastAPI

from fastapi_jobs import Every, Scheduler

JOBS = 2000

scheduler = Scheduler()


async def report() -> None: ...


for i in range(JOBS):
    scheduler.add_job(report, Every(hours=24), name=f"job-{i:04d}", paused=i % 10 == 0)

app = FastAPI(lifespan=scheduler.lifespan)
