"""What the answer to a batch of claims does to its jobs' runners: the
winners get their fence (the dispatcher wakes them), the others are freed and
their ticks counted as skipped, with why (`JobRunner.lost`: held elsewhere;
`JobRunner.changed_under`: the stored schedule changed, its tick handed on)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import anyio

from .._errors import ScheduleChangedError, TickAheadError
from .reclaims import Reclaims
from .runner import JobRunner

__all__ = ["apply_answers"]


def apply_answers(
    pending: Iterator[JobRunner],
    fences: Mapping[str, int | Exception] | Exception,
    claimed_at: float,
    reclaims: Reclaims | None,
    watching: bool,
    ahead: list[JobRunner],
) -> list[JobRunner]:
    """The runners of ``pending`` whose claim was made (their fence set); the
    others are freed and their ticks counted as skipped, but those whose tick
    is still in the future on the database's clock, which go into ``ahead``
    (their tick is claimed again when the database reaches it). ``reclaims``:
    the hand-off rows watched (with a store), which forget a job whose claim
    was made (while any is ``watching``) and watch a hand-off claimed
    elsewhere."""
    won: list[JobRunner] = []
    if isinstance(fences, Exception):
        for runner in pending:
            runner.free()
            runner.skipped("store_unavailable", runner.due)  # logged by the claim
        return won
    for runner in pending:
        fence = fences.get(runner.job.name)
        if isinstance(fence, int):
            runner.claimed(fence, claimed_at)
            won.append(runner)
            if watching:
                assert reclaims is not None
                reclaims.forget(runner.job.name)
        elif fence is None:
            runner.lost()
            if runner.job.enqueue is not None and reclaims is not None:
                # Its claimer may die before enqueuing: watch the row.
                reclaims.saw(runner, runner.due, anyio.current_time())
        elif isinstance(fence, TickAheadError):
            runner.free()
            ahead.append(runner)
        elif isinstance(fence, ScheduleChangedError):
            runner.changed_under()
        else:
            runner.free()
            runner.skipped("store_unavailable", runner.due)
            runner.logger.warning(
                "job %r: the store refused its claim, tick skipped: %r",
                runner.job.name,
                fence,
                extra={"job": runner.job.name},
            )
    return won
