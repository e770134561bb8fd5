"""``fastapi-jobs backfill``: a job run once for every tick of a past range,
from outside the app, inside the app's own lifespan (as ``run``), each tick
claimed like a live one. One progress line per tick on stderr, a summary on
stdout.

Exit codes: 0 every tick ran ok or had run already; 1 a tick failed (or timed
out, or was cancelled), a tick's lease stayed held elsewhere, or the store
could not be reached; 2 bad input (an unknown job, a range without a time
zone, reversed, in the future, or with more ticks than ``--max``); 128 + the
signal's number (143 SIGTERM, 130 SIGINT) when a signal stopped it (after the
run in flight, which ends as in ``run``).
"""

from __future__ import annotations

import argparse
import signal
import sys
from datetime import UTC, datetime
from typing import Any

import anyio

from .._backfill.results import BackfillResult, BackfillTick
from .._backfill.runs import MAX_TICKS
from .._errors import ConfigurationError, FastAPIJobsError, JobNotFoundError
from .._scheduler import Scheduler, seam_of

__all__ = ["add_parser", "backfill"]

OK, FAILED, BAD_INPUT = 0, 1, 2


def add_parser(commands: Any, target_help: str) -> None:
    """The ``backfill`` command, on the CLI's subparsers."""
    parser = commands.add_parser(
        "backfill",
        help="run a job once for every tick of a past range, oldest first",
        description="Enter the app's own lifespan and run the job once for every tick of "
        "its schedule from --since to --until (both included, in the past), oldest first, "
        "each claimed like a live tick: with a store, a tick that ran already (on any "
        f"instance) is skipped. At most {MAX_TICKS} ticks unless --max says more. Exit 0 "
        "every tick ran ok or had run already, 1 a tick failed or could not be claimed (or "
        "the store could not be reached), 2 bad input.",
        epilog="example:\n  fastapi-jobs backfill app.main:app send_digest "
        "--since 2026-12-01T00:00:00Z --until 2026-12-02T00:00:00Z",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", help=target_help)
    parser.add_argument("job", help="the job's name")
    parser.add_argument("--since", required=True, help="the range's start: an ISO 8601 instant")
    parser.add_argument("--until", required=True, help="the range's end (included), in the past")
    parser.add_argument(
        "--max", type=int, default=MAX_TICKS, help=f"the most ticks to run (default {MAX_TICKS})"
    )


def _instant(what: str, text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"--{what} {text[:60]!r} is not an ISO 8601 instant: e.g. 2026-12-01T08:00:00Z"
        ) from None


def _shown(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _progress(number: int, count: int, tick: BackfillTick) -> None:
    print(f"[{number}/{count}] {_shown(tick.tick)} {tick.describe()}", file=sys.stderr, flush=True)


async def backfill(scheduler: Scheduler, app: Any, args: argparse.Namespace) -> int:
    """``fastapi-jobs backfill``: the exit code."""
    try:
        since, until = _instant("since", args.since), _instant("until", args.until)
    except ConfigurationError as exc:
        print(f"fastapi-jobs: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    signalled: list[int] = []
    work = anyio.CancelScope()
    result: BackfillResult | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, scheduler, work, signalled)
        try:
            async with (
                seam_of(scheduler).app_state(app) as state,
                scheduler.running(state, ticking=False),
            ):
                with work:
                    result = await scheduler.backfill(
                        args.job, since, until, max_ticks=args.max, progress=_progress
                    )
        except (ConfigurationError, JobNotFoundError) as exc:
            print(f"fastapi-jobs: error: {exc}", file=sys.stderr)
            return BAD_INPUT
        except FastAPIJobsError as exc:
            scheduler.logger.error("not run: %s", exc)
            return FAILED
        finally:
            tg.cancel_scope.cancel()
    if signalled:
        # Leaving running() waited for the run in flight (or cut it) and released it.
        scheduler.logger.error("backfill of job %r stopped by a signal", args.job)
        return 128 + signalled[0]
    assert result is not None
    print(_summary(result))
    return OK if result.ok else FAILED


def _summary(result: BackfillResult) -> str:
    said = (
        f"job {result.job!r}: {result.ticks} tick(s) from {_shown(result.since)} to "
        f"{_shown(result.until)}: {result.ran} ran ok, {result.failed} failed, "
        f"{result.skipped_ran_already} ran already, {result.skipped_held} held elsewhere"
    )
    if result.stopped is not None:
        said += f"; stopped after {len(result.outcomes)}: {result.stopped}"
    return said


async def _stop_on_signal(
    scheduler: Scheduler, work: anyio.CancelScope, signalled: list[int]
) -> None:
    """SIGTERM or SIGINT: no more ticks; the run in flight ends as the app's
    shutdown lets it (``shutdown_timeout``), as ``run``'s does."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            signalled.append(signum)
            scheduler.logger.warning(
                "%s: stopping after the run in flight", signal.Signals(signum).name
            )
            work.cancel()
            return
