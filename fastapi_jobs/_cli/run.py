"""``fastapi-jobs run``: one run of a job from outside the app, inside the app's
own lifespan, claimed like a tick; its exit codes (see ``_cli.main``)."""

from __future__ import annotations

import signal
from typing import Any

import anyio

from .._control import TriggeredRun
from .._errors import FastAPIJobsError, JobRunningError
from .._results import RunResult
from .._scheduler import Scheduler, seam_of
from .._status import ErrorInfo
from ..queues import handoff_key

__all__ = ["CLAIMED_ELSEWHERE", "FAILED", "OK", "run"]

OK, FAILED, CLAIMED_ELSEWHERE = 0, 1, 3


async def run(scheduler: Scheduler, app: Any, name: str, force: bool) -> int:
    """``fastapi-jobs run``: the exit code (``name`` is a job of ``scheduler``)."""
    # What a signal cuts: the latest of these (the app's startup, then its run).
    stoppable = [anyio.CancelScope()]
    signalled: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, scheduler, stoppable, signalled)
        try:
            code = await _run_once(scheduler, app, name, force, stoppable, signalled)
        finally:
            tg.cancel_scope.cancel()
    return code


async def _stop_on_signal(
    scheduler: Scheduler, stoppable: list[anyio.CancelScope], signalled: list[int]
) -> None:
    """SIGTERM (what Kubernetes sends a CronJob's pod) or SIGINT: the app's own
    shutdown, as uvicorn gives it. The run in flight gets ``shutdown_timeout`` to
    end, then is cut; either way it is recorded and released. A second signal
    gets Python's default (the handler is gone by then)."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            signalled.append(signum)
            timeout = scheduler.shutdown_timeout
            scheduler.logger.warning(
                "%s: stopping; the run in flight gets %s to end",
                signal.Signals(signum).name,
                "as long as it takes" if timeout is None else f"{timeout:g}s",
            )
            stoppable[-1].cancel()
            return


async def _run_once(
    scheduler: Scheduler,
    app: Any,
    name: str,
    force: bool,
    stoppable: list[anyio.CancelScope],
    signalled: list[int],
) -> int:
    triggered: list[TriggeredRun] = []
    # A signal cuts the app's startup too (a lifespan stuck on its database).
    # Once the app has started, it cuts only the run's wait: the scheduler's
    # start (bounded by the store's timeout) ends, then its stop and the app's
    # own shutdown run uncut, as uvicorn gives them.
    with stoppable[0]:
        async with seam_of(scheduler).app_state(app) as state:
            work = anyio.CancelScope()
            stoppable.append(work)
            async with scheduler.running(state, ticking=False):
                with work:
                    return await _run_started(scheduler, name, force, triggered)
    # A signal: leaving running() waited for the run (or cut it) and released it.
    stopped = 128 + signalled[0]  # the shell's code for "ended by that signal"
    result = triggered[0].result() if triggered else None
    if result is None or result.outcome == "cancelled":
        scheduler.logger.error("job %r did not run to its end: stopped by a signal", name)
        return stopped
    return _exit_code(scheduler, name, result)


async def _run_started(
    scheduler: Scheduler, name: str, force: bool, triggered: list[TriggeredRun]
) -> int:
    """The run, in a running scheduler (``triggered`` gets it once started)."""
    logger = scheduler.logger
    # With a store, running() read its pauses: an operator's pause, and that of
    # an every_instance job, as much as the declared one.
    seam = seam_of(scheduler)
    paused = seam.paused(name)
    if paused is None and not force:
        logger.error(
            "not run: the store's pauses of job %r could not be read (is the "
            "database reachable?); pass --force to run it anyway",
            name,
        )
        return FAILED
    if paused and not force:
        logger.info("not run: job %r is paused (resume it, or pass --force to run it anyway)", name)
        return CLAIMED_ELSEWHERE
    try:
        if force:
            triggered.append(await scheduler.trigger(name))
        else:
            triggered.append(await seam.start_current_tick(name))
    except JobRunningError as exc:
        logger.info("not run: %s", exc)
        return CLAIMED_ELSEWHERE
    except FastAPIJobsError as exc:
        logger.error("not run: %s", exc)
        return FAILED
    return _exit_code(scheduler, name, await triggered[0].wait())


def _exit_code(scheduler: Scheduler, name: str, result: RunResult | None) -> int:
    logger = scheduler.logger
    if result is None:
        logger.error("job %r did not run to its end (its lease was lost)", name)
        return FAILED
    if result.ok:
        handoff = scheduler.jobs[name].enqueue
        # A hand-off's run is its enqueue: say what went where, under which key.
        said = (
            ""
            if handoff is None
            else f"; handed to {handoff.name} under the key {handoff_key(name, result.tick)!r}"
        )
        logger.info("job %r: tick %s ok in %.3fs%s", name, _at(result), result.duration_s, said)
        return OK
    logger.error(
        "job %r: tick %s %s in %.3fs%s",
        name,
        _at(result),
        result.outcome,
        result.duration_s,
        "" if result.error is None else f": {ErrorInfo.of(result.error)}",
    )
    return FAILED


def _at(result: RunResult) -> str:
    """The tick the run was for, as the logs say ticks."""
    return result.tick.isoformat(timespec="seconds").replace("+00:00", "Z")
