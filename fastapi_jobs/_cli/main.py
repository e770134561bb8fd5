"""The ``fastapi-jobs`` command (also ``python -m fastapi_jobs``): list an app's
jobs, show a cron expression's next run times, run a job once from outside
(a Kubernetes CronJob, a host's crontab, a human), and list, make, change and
remove the schedules made at run time (``_cli.schedules``).

Exit codes of every command: 0 done; 1 a failure (the store could not be
reached; for ``run``, the run failed); 2 a usage error (bad input, an unknown
name, a target that is not found).

Exit codes of ``run``: 0 the run ended ok; 1 it failed or timed out (or the
store could not be reached); 2 a usage error (unknown job, a target that is not
found); 3 not run: the tick was claimed elsewhere (an app instance runs it), the
job runs elsewhere, or it is paused; 128 + the signal's number (143 SIGTERM,
130 SIGINT) when a signal stopped it before its run ended.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio

from .._clock import as_datetime
from .._distribution import described
from .._errors import ConfigurationError, JobNotFoundError
from .._logging import FORMAT
from .._scheduler import Scheduler, seam_of
from .._schedules import Cron
from .._status import ClusterJobStatus, pause_end, state_word
from .._store import Store
from .backfill import add_parser as add_backfill
from .backfill import backfill
from .run import OK, run
from .schedules import add_filters, add_parsers, schedules, shown_page

__all__ = ["main"]

USAGE = 2


class UsageError(Exception):
    """A mistake in what was asked: exit 2 with this message."""


_TARGET_HELP = (
    "MODULE:ATTR naming the Scheduler (app.main:scheduler) or the FastAPI app whose "
    "lifespan is scheduler.lifespan (app.main:app); run from the directory the app is "
    "imported from, as for uvicorn"
)


def _parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="fastapi-jobs",
        description="Look at and run the jobs of a fastapi_jobs app from outside it.",
        epilog="examples:\n"
        "  fastapi-jobs list app.main:scheduler\n"
        '  fastapi-jobs next "0 7 * * mon-fri" --tz Europe/Lisbon -n 5\n'
        "  fastapi-jobs run app.main:scheduler send_digest\n"
        "  fastapi-jobs schedules app.main:app",
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {described()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_list(commands)
    nxt = commands.add_parser(
        "next",
        help="the next run times of a cron expression",
        description="Print the next run times of a cron expression, in its time zone and UTC.",
        epilog='example:\n  fastapi-jobs next "0 7 * * mon-fri" --tz Europe/Lisbon -n 5',
        formatter_class=formatter,
    )
    nxt.add_argument("expr", help='a cron expression, e.g. "*/15 * * * *" or "@daily"')
    nxt.add_argument("--tz", default="UTC", help="an IANA time zone (default UTC)")
    nxt.add_argument("-n", type=int, default=5, help="how many (default 5)")

    run = commands.add_parser(
        "run",
        help="run one job once, as the app would (claiming the current tick)",
        description="Enter the app's own lifespan (Scheduler(lifespan=...)) for its state, "
        "and run the job once. With a store, the job's current tick is claimed first, so "
        "that an app instance does not run it too. Exit 0 ok, 1 failed or timed out, "
        "2 usage error, 3 the tick was claimed elsewhere (or the job is paused).",
        epilog="examples:\n"
        "  fastapi-jobs run app.main:scheduler send_digest\n"
        "  fastapi-jobs run app.main:app send_digest --force   # again, or while paused",
        formatter_class=formatter,
    )
    run.add_argument("target", help=_TARGET_HELP)
    run.add_argument("job", help="the job's name")
    run.add_argument(
        "--force",
        action="store_true",
        help="run even if the current tick ran already or the job is paused (a run by "
        "hand, as POST /jobs/{name}/run: still never beside a run going elsewhere)",
    )
    add_parsers(commands, _TARGET_HELP)
    add_backfill(commands, _TARGET_HELP)
    return parser


def _add_list(commands: Any) -> None:
    listing = commands.add_parser(
        "list",
        help="each job: its schedule, next run times, claimed or not, paused or not",
        description="List the jobs of an app: schedule in words, the next run times "
        "(local and UTC), whether ticks are claimed in a store, whether paused (with a "
        "store, as the store has it: the app's lifespan is entered to reach it).",
        epilog="examples:\n  fastapi-jobs list app.main:scheduler -n 3\n"
        "  fastapi-jobs list app.main:scheduler --state failing --name report --limit 20",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument("target", help=_TARGET_HELP)
    listing.add_argument("-n", type=int, default=3, help="run times per job (default 3)")
    add_filters(listing, "jobs")


# aiosqlite's worker threads hand their last answers to the event loop (a
# connection's close; a failed or abandoned connect's stop), after the awaiting
# side is gone. Once the loop is closed, each prints a thread's traceback
# ("Event loop is closed": omnilib/aiosqlite#241). The command's loop waits for
# them (they end within milliseconds), at most this long (seconds).
_SQLITE_THREADS = "(_connection_worker_thread)"
_SQLITE_SETTLE = 2.0


async def _settled(command: Callable[..., Awaitable[int]], *args: Any) -> int:
    """``command(*args)``, then the wait for aiosqlite's threads (see above)."""
    try:
        return await command(*args)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_join_sqlite_threads, _SQLITE_SETTLE)


def _join_sqlite_threads(within: float) -> None:
    deadline = time.monotonic() + within
    for thread in threading.enumerate():
        if _SQLITE_THREADS in thread.name:
            thread.join(max(0.0, deadline - time.monotonic()))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    args = _parser().parse_args(argv)  # exits 2 on a usage error, 0 on --help
    logging.basicConfig(level=logging.INFO, format=FORMAT, stream=sys.stderr)
    try:
        if args.command == "next":
            return _next(args.expr, args.tz, args.n)
        scheduler, app = load(args.target)
        if args.command == "list":
            if args.state == "left_alone":
                raise UsageError(
                    "--state left_alone: list lists the jobs declared in code; the "
                    "stored schedules an app cannot run are in: fastapi-jobs schedules "
                    "TARGET --state left_alone"
                )
            return anyio.run(_settled, _list, scheduler, app, _count(args.n), args)
        if args.command in ("schedules", "schedule"):
            return anyio.run(_settled, schedules, scheduler, app, args)
        if args.command == "backfill":
            return anyio.run(_settled, backfill, scheduler, app, args)
        if args.job not in scheduler.jobs:
            raise UsageError(str(JobNotFoundError(args.job, list(scheduler.jobs))))
        return anyio.run(_settled, run, scheduler, app, args.job, args.force)
    except UsageError as exc:
        print(f"fastapi-jobs: error: {exc}", file=sys.stderr)
        return USAGE
    except BrokenPipeError:  # `fastapi-jobs list ... | head`: the reader has what it wanted
        # What is still buffered must not fail again as Python flushes at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _count(n: int) -> int:
    if not 1 <= n <= 1000:
        raise UsageError(f"-n {n}: must be from 1 to 1000")
    return n


def _next(expr: str, tz: str, n: int) -> int:
    count = _count(n)  # before anything is printed
    try:
        cron = Cron(expr, tz=tz)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    print(cron.describe())
    ts = datetime.now(UTC).timestamp()
    for _ in range(count):
        ts = cron.next_after(ts)
        print(_when(ts, cron.tz))
    return OK


def _when(ts: float, tz: Any) -> str:
    """``ts`` in ``tz``, and in UTC if that differs."""
    at = as_datetime(ts)
    local = at.astimezone(tz)
    clock = "%H:%M:%S.%f" if at.microsecond else "%H:%M:%S"  # sub-second intervals
    shown = local.strftime(f"%Y-%m-%d {clock} %Z")
    if local.utcoffset() == at.utcoffset():
        return shown
    return f"{shown}  ({at.strftime(f'%Y-%m-%d {clock}')} UTC)"


# -- finding the scheduler ------------------------------------------------------


def load(target: str) -> tuple[Scheduler, Any]:
    """The scheduler ``target`` names, and the app to give its lifespan (or None)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UsageError(f"{target!r} is not MODULE:ATTR ({_TARGET_HELP})")
    if module_name.startswith("."):
        raise UsageError(
            f"cannot import {module_name!r}: a relative name; give the module's full "
            f"dotted name ({_TARGET_HELP})"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as uvicorn does: the app's own package
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise UsageError(f"cannot import {module_name!r}: {exc}") from None
        raise  # the app's own import failed: its traceback says why
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
        found = getattr(found, part)
    if isinstance(found, Scheduler):
        apps = [v for v in vars(module).values() if _scheduler_of(v) is found]
        return found, apps[0] if apps else None
    scheduler = _scheduler_of(found)
    if scheduler is None:
        raise UsageError(
            f"{target} is a {type(found).__name__}, and no Scheduler was found from it: "
            "name the Scheduler (MODULE:scheduler), or an app built with "
            "FastAPI(lifespan=scheduler.lifespan) or holding app.state.scheduler"
        )
    return scheduler, found


def _scheduler_of(app: object) -> Scheduler | None:
    """The scheduler of a FastAPI/Starlette app: its lifespan's, or app.state.scheduler."""
    router = getattr(app, "router", None)
    found = _lifespan_owner(getattr(router, "lifespan_context", None), depth=0)
    if found is not None:
        return found
    state = getattr(app, "state", None)
    held = getattr(state, "scheduler", None) if state is not None else None
    return held if isinstance(held, Scheduler) else None


def _lifespan_owner(lifespan: object, depth: int) -> Scheduler | None:
    """The Scheduler whose ``lifespan`` this is, looking through the wrappers
    FastAPI puts around it (``include_router`` merges routers' lifespans into
    closures)."""
    owner = getattr(lifespan, "__self__", None)
    if isinstance(owner, Scheduler):
        return owner
    if depth > 5:
        return None
    inner: list[object] = [getattr(lifespan, "__wrapped__", None)]
    for cell in getattr(lifespan, "__closure__", None) or ():
        try:
            inner.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    for candidate in inner:
        if callable(candidate):
            found = _lifespan_owner(candidate, depth + 1)
            if found is not None:
                return found
    return None


# -- list and run -----------------------------------------------------------------


async def _list(scheduler: Scheduler, app: Any, n: int, args: argparse.Namespace) -> int:
    now = datetime.now(UTC).timestamp()
    # A job's claim says whether it fails or runs: every claim read only then;
    # else those of the jobs shown, for their runs on every instance.
    every_claim = args.state in ("failing", "running")
    async with _opened_store(scheduler, app) as store:
        pauses, claims = await _store_state(scheduler, store, every_claim)

        def until_of(name: str) -> float:
            declared = scheduler.jobs[name].declared_pause
            return declared if pauses is None else pauses.get(name, declared)

        def state(name: str) -> str:
            claim = claims.get(name)
            running = claim is not None and claim.running_on is not None
            return state_word(
                until_of(name) > now, running, None if claim is None else claim.last_outcome
            )

        names = [
            name
            for name in scheduler.jobs
            if args.name.casefold() in name.casefold() and (args.state in (None, state(name)))
        ]
        try:
            shown = shown_page(names, args, by_name=False)
        except ValueError as exc:  # a bad --after
            raise UsageError(str(exc)) from None
        if store is not None and pauses is not None and not every_claim:
            claims = await _claims_of(scheduler, store, shown)
    for name in shown:
        _print_job(scheduler, name, until_of(name), claims.get(name), pauses is None, now, n)
    return OK


def _print_job(
    scheduler: Scheduler,
    name: str,
    until: float,
    claim: ClusterJobStatus | None,
    unread: bool,
    now: float,
    n: int,
) -> None:
    """One job of ``fastapi-jobs list``: its schedule, where it runs, its pause
    (``unread``: as declared, the store unread), its runs on every instance
    (``claim``, with a store), and its next ``n`` run times."""
    job = scheduler.jobs[name]
    if seam_of(scheduler).claimed(name):
        where = "claimed in the store (one instance per tick)"
    elif job.every_instance:
        where = "every instance"
    else:
        where = "every process (no store)"
    paused = "paused" if until > now else "not paused"
    if pause_end(until, now) is not None:
        paused += f" until {_when(until, UTC)}"
    if unread and scheduler.store is not None:
        paused += " (as declared: the store could not be read)"
    print(f"{name}\n  {job.schedule.describe()}\n  {where}; {paused}")
    if claim is not None:  # this command runs nothing: only the store counts runs
        ran = f"  runs: {claim.runs} on all instances"
        ended = claim.last_finished_at
        if claim.last_outcome is not None and ended is not None:
            ran += f"; the last: {claim.last_outcome}, {ended:%Y-%m-%d %H:%M:%S} UTC"
        print(ran)
    # In the job's own zone (a cron's), else UTC: the machine's zone is no
    # job's, and differs between the operator's laptop and the pods.
    zone = getattr(job.schedule, "tz", None) or UTC
    times, ts = [], now
    try:
        for _ in range(n):
            ts = job.schedule.next_after(ts)
            times.append(f"  next: {_when(ts, zone)}")
    except Exception as exc:  # noqa: BLE001 - a user's schedule
        times.append(f"  next: its schedule fails: {exc!r}")
    print("\n".join(times))  # outside the try: a closed pipe is no schedule's fault


@asynccontextmanager
async def _opened_store(scheduler: Scheduler, app: Any) -> AsyncIterator[Store | None]:
    """The scheduler's store, opened in the app's state for the block; None
    without a store, or if it cannot be opened (said in the log: the listing
    then shows what is declared)."""
    store = scheduler.store
    if store is None:
        yield None
        return
    async with AsyncExitStack() as stack:
        opened: Store | None = store
        try:
            state = await stack.enter_async_context(seam_of(scheduler).app_state(app))
            await store.open(state, scheduler.instance)
            stack.push_async_callback(store.close)
        except Exception as exc:  # noqa: BLE001 - list what is declared instead
            scheduler.logger.warning("cannot read the store's pauses: %r", exc)
            opened = None
        yield opened


async def _store_state(
    scheduler: Scheduler, store: Store | None, every_claim: bool
) -> tuple[Mapping[str, float] | None, Mapping[str, ClusterJobStatus]]:
    """The store's pauses (None without a store, or if it cannot be read), and
    with ``every_claim`` each job's last claimed run (one reading of the cluster)."""
    if store is None:
        return None, {}
    try:
        with anyio.fail_after(store.timeout):
            if every_claim:
                view = await store.read()
                return view.pauses, view.jobs
            return {job: until for job, (until, _) in (await store.pauses()).items()}, {}
    except Exception as exc:  # noqa: BLE001 - list what is declared instead
        scheduler.logger.warning("cannot read the store's pauses: %r", exc)
        return None, {}


async def _claims_of(
    scheduler: Scheduler, store: Store, names: Sequence[str]
) -> Mapping[str, ClusterJobStatus]:
    """The claims of the jobs ``names`` (where the store can read only theirs),
    each with its runs on every instance; none if the store cannot be read."""
    narrow = seam_of(scheduler).read_jobs
    try:
        with anyio.fail_after(store.timeout):
            view = await (store.read() if narrow is None else narrow(names, False))
    except Exception as exc:  # noqa: BLE001 - list the rest without the runs
        scheduler.logger.warning("cannot read the store's claims: %r", exc)
        return {}
    return view.jobs
