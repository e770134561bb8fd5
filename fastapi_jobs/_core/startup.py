"""What a scheduler says as it starts: what runs when and where, and a warning
when several processes would each run every unclaimed job."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys

from .._status import pause_end, utc
from .parts import Parts
from .runner import JobRunner

__all__ = ["log_start", "warn_if_in_several_processes", "warn_if_unclaimed_in_several_processes"]

# Start-up lines name each job up to this many; then one line counts the rest.
_LISTED_AT_START = 50


def log_start(logger: logging.Logger, runners: list[JobRunner], now: float) -> None:
    """One line per job (a summary past the first few dozen): what runs when."""
    if not logger.isEnabledFor(logging.INFO):
        return
    for runner in runners[:_LISTED_AT_START]:
        job = runner.job
        where = (
            "claimed in the store (one instance per tick)"
            if runner.store is not None
            else "in every instance"
            if job.every_instance
            else "in this process (no store)"
        )
        try:
            nxt = utc(job.schedule.next_after(now))
        except Exception:  # noqa: BLE001 - a user's schedule; its loop reports it
            nxt = None
        paused = ""
        if runner.pause_unknown:  # an every_instance job, until the store's pauses are read
            paused = ", waiting for the store's pauses to be read"
        elif runner.paused_until > now:
            end = pause_end(runner.paused_until, now)
            paused = ", paused" + ("" if end is None else f" until {end.isoformat()}")
        logger.info(
            "job %r: %s, next run %s, %s%s",
            job.name,
            job.schedule.describe(),
            "unknown" if nxt is None else nxt.isoformat(timespec="seconds"),
            where,
            paused,
        )
    if len(runners) > _LISTED_AT_START:
        logger.info("and %d more jobs (GET /jobs lists them all)", len(runners) - _LISTED_AT_START)


def warn_if_unclaimed_in_several_processes(parts: Parts) -> None:
    unclaimed = [
        n for n, r in parts.runners.items() if r.store is None and not r.job.every_instance
    ]
    if unclaimed and _several_processes():
        parts.logger.warning(
            "this app runs in several processes and has no store: every process "
            "runs these jobs on every tick: %s. Pass Scheduler(store=SQLAlchemyStore(...)) "
            "to run each tick once, or every_instance=True for jobs that may run "
            "everywhere.",
            ", ".join(unclaimed),
        )


def warn_if_in_several_processes(logger: logging.Logger, schedule: str) -> None:
    """A schedule made at run time without a store lives in the process that
    made it: with several, in one of them (the one a request reached)."""
    if _several_processes():
        logger.warning(
            "schedule %r is kept in this process only: the app runs in several processes "
            "and has no store, so the others neither run it nor know it. Pass "
            "Scheduler(store=SQLAlchemyStore(...)) to keep schedules in the database.",
            schedule,
        )


def _several_processes() -> bool:
    """Whether this app runs, or is told it will run, in several worker processes."""
    try:
        if int(os.environ.get("WEB_CONCURRENCY", "1")) > 1:
            return True
    except ValueError:
        pass
    if "gunicorn" in os.environ.get("SERVER_SOFTWARE", "") or "gunicorn" in sys.argv[0]:
        return True
    # uvicorn --workers N runs each worker as a multiprocessing child.
    return multiprocessing.parent_process() is not None and "uvicorn" in " ".join(sys.argv)
