"""What the answer to an instant's claims does to its jobs' runners: the
winners get their fence (the dispatcher wakes them), the others are freed and
their ticks counted as skipped, with why. Every instance but one passes here
for every job of an instant, so the common case is inlined."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import anyio

from .._errors import TickAheadError
from .reclaims import Reclaims
from .runner import JobRunner

__all__ = ["answered"]


def answered(
    pending: Iterator[JobRunner],
    fences: Mapping[str, int | Exception] | Exception,
    claimed_at: float,
    reclaims: Reclaims | None,
    watching: bool,
    ahead: list[JobRunner],
) -> list[JobRunner]:
    """The runners of ``pending`` whose claim was made (their fence set); the
    others are settled and their ticks counted as skipped, but those whose tick
    is still in the future on the database's clock, which go into ``ahead``
    (their tick is claimed again when the database reaches it). ``reclaims``:
    the hand-off rows watched (with a store), which forget a job whose claim
    was made (while any is ``watching``) and watch a hand-off claimed
    elsewhere."""
    won: list[JobRunner] = []
    if isinstance(fences, Exception):
        for runner in pending:
            runner.settle()
            runner.skipped("store_unavailable", runner.due)  # logged by the claim
        return won
    for runner in pending:
        fence = fences.get(runner.job.name)
        if isinstance(fence, int):
            runner.fence, runner.claimed_at = fence, claimed_at
            won.append(runner)
            if watching:
                assert reclaims is not None
                reclaims.forget(runner.job.name)
        elif (
            fence is None
            and runner.fence is None
            and runner.manual is None
            and runner.observers is None
            and runner.job.enqueue is None
            and not runner.stopping
        ):
            # settle() and skipped("claimed_elsewhere"), inlined: every
            # instance but one passes here for every job of the instant.
            runner.in_flight = runner.woken = False
            stats = runner.stats
            counts = stats.skipped
            if counts is None:
                counts = stats.skipped = {}
            counts["claimed_elsewhere"] = counts.get("claimed_elsewhere", 0) + 1
        elif isinstance(fence, TickAheadError):
            runner.settle()
            ahead.append(runner)
        else:
            _not_claimed(runner, fence, reclaims)
    return won


def _not_claimed(runner: JobRunner, fence: Exception | None, reclaims: Reclaims | None) -> None:
    runner.settle()
    if fence is None:
        runner.skipped("claimed_elsewhere", runner.due)
        if runner.job.enqueue is not None and reclaims is not None:
            # Its claimer may die before enqueuing: watch the row.
            reclaims.saw(runner, runner.due, anyio.current_time())
        return
    runner.skipped("store_unavailable", runner.due)
    runner.logger.warning(
        "job %r: the store refused its claim, tick skipped: %r",
        runner.job.name,
        fence,
        extra={"job": runner.job.name},
    )
