"""``fastapi-jobs schedules`` and ``fastapi-jobs schedule add|change|remove|apply``: the
schedules made at run time, from outside the app. The app's scheduler is opened
as ``run`` opens it (its own lifespan entered, the scheduler started without
ticking, so the store is open) and the change made through its public API.

Exit codes: 0 done; 1 the store could not be reached or did not confirm (the
message says whether anything may have changed); 2 bad input, an unknown name
or task, a taken name, or an app without a store (a change made here would live
in this process only, and end with it), or a set past max_schedules.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._dynamic.sets import ScheduleSpec
from .._dynamic.stored import StoredSchedule
from .._errors import (
    ConfigurationError,
    FastAPIJobsError,
    JobNotFoundError,
    TooManySchedulesError,
)
from .._redaction import shown
from .._scheduler import Scheduler, seam_of
from .._schedules import Cron, Every, Schedule
from .._status import FILTER_STATES, ErrorInfo

__all__ = ["add_filters", "add_parsers", "schedules", "shown_page"]

OK, STORE_FAILED, BAD_INPUT = 0, 1, 2

_KWARGS = """e.g. --kwargs '{"tenant": "acme"}'"""


def add_parsers(commands: Any, target_help: str) -> None:
    """The ``schedules`` and ``schedule`` commands, on the CLI's subparsers."""
    formatter = argparse.RawDescriptionHelpFormatter
    listing = commands.add_parser(
        "schedules",
        help="the schedules made at run time: name, task, schedule, kwargs, known",
        description="List the schedules made at run time (with a store: as the store has "
        "them). 'left alone here': this release cannot run it, and says why (an instance "
        "that can runs the schedule).",
        epilog="examples:\n  fastapi-jobs schedules app.main:app\n"
        "  fastapi-jobs schedules app.main:app --name acme --state failing --limit 50",
        formatter_class=formatter,
    )
    listing.add_argument("target", help=target_help)
    add_filters(listing, "schedules")

    schedule = commands.add_parser(
        "schedule",
        help="make, change or remove a schedule made at run time",
        description="Make, change or remove a schedule made at run time, in the app's store: "
        "every instance follows within a heartbeat. Exit 0 done, 1 the store could not be "
        "reached or did not confirm, 2 bad input or an unknown name.",
        epilog="examples:\n"
        "  fastapi-jobs schedule add app.main:app acme-report report --cron '0 7 * * *' "
        '--tz Europe/Lisbon --kwargs \'{"tenant": "acme"}\'\n'
        "  fastapi-jobs schedule change app.main:app acme-report --every 3600 "
        "--option retries=2\n"
        "  fastapi-jobs schedule remove app.main:app acme-report",
        formatter_class=formatter,
    )
    verbs = schedule.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser(
        "add", help="make one", epilog=schedule.epilog, formatter_class=formatter
    )
    change = verbs.add_parser(
        "change",
        help="change what is given (the rest stays)",
        epilog=schedule.epilog,
        formatter_class=formatter,
    )
    remove = verbs.add_parser("remove", help="remove one", epilog=schedule.epilog)
    for parser in (add, change, remove):
        parser.add_argument("target", help=target_help)
        parser.add_argument("name", help="the schedule's name (its job's)")
    _add_apply(verbs, target_help)
    add.add_argument("task", help="the task it runs (registered with @scheduler.task())")
    change.add_argument("--task", help="the task it runs from now on")
    _add_spec_arguments(add, change)


def _add_apply(verbs: Any, target_help: str) -> None:
    """``schedule apply TARGET --group G FILE``."""
    apply = verbs.add_parser(
        "apply",
        help="make a group's schedules exactly those of a JSON file",
        description="Make the schedules of GROUP exactly those in FILE, in one transaction: "
        "those missing are made, those that differ changed, the group's others removed. The "
        "same file again changes nothing. FILE holds what PUT /jobs/schedules takes: "
        '{"schedules": [{"name": ..., "task": ..., "schedule": {"every": 3600}, "kwargs": '
        '{...}, "options": {...}}, ...]}. Prints what was done, as JSON.',
        epilog="example:\n  fastapi-jobs schedule apply app.main:app --group reports reports.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    apply.add_argument("target", help=target_help)
    apply.add_argument("--group", required=True, help="the set's name (a tenant, a source)")
    apply.add_argument("file", help="the JSON file, or - for standard input")


def _add_spec_arguments(add: argparse.ArgumentParser, change: argparse.ArgumentParser) -> None:
    """What ``add`` and ``change`` take: the schedule, its arguments, its options."""
    for parser in (add, change):
        when = parser.add_mutually_exclusive_group(required=parser is add)
        when.add_argument("--every", type=float, metavar="SECONDS", help="an interval")
        when.add_argument("--cron", metavar="EXPR", help='a cron expression, e.g. "0 7 * * *"')
        parser.add_argument("--offset", type=float, default=0.0, help="with --every (seconds)")
        parser.add_argument("--tz", default="UTC", help="with --cron: an IANA zone (UTC)")
        parser.add_argument(
            "--kwargs", metavar="JSON", help='the task\'s arguments, e.g. \'{"tenant": "acme"}\''
        )
        parser.add_argument(
            "--option",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a job option (timeout, retries, retry_backoff, retry_timeouts, paused, "
            "catch_up, every_instance), its value JSON (retries=2, paused=true, timeout=30)",
        )


class _Refused(Exception):
    """Bad input noticed before the app is opened: exit 2 with this message."""


async def schedules(scheduler: Scheduler, app: Any, args: argparse.Namespace) -> int:
    """The ``schedules`` or ``schedule`` command: its exit code."""
    try:
        act = _action(scheduler, args)
        async with (
            seam_of(scheduler).app_state(app) as state,
            scheduler.running(state, ticking=False),
        ):
            await act()
    except (ConfigurationError, JobNotFoundError, TooManySchedulesError, _Refused) as exc:
        return _said(exc, BAD_INPUT)
    except FastAPIJobsError as exc:  # StoreError, UnconfirmedError: their message says which
        return _said(exc, STORE_FAILED)
    except BrokenPipeError:
        raise  # `... | head`: the reader has what it wanted (main() says so by 141)
    except Exception as exc:  # noqa: BLE001 - the store's driver, a timeout
        return _said(f"the store could not be reached ({ErrorInfo.of(exc)})", STORE_FAILED)
    return OK


def _said(error: object, code: int) -> int:
    print(f"fastapi-jobs: error: {error}", file=sys.stderr)
    return code


def _action(scheduler: Scheduler, args: argparse.Namespace) -> Callable[[], Any]:
    if args.command == "schedules":

        async def listing() -> None:
            listed = await scheduler.schedules()
            if not listed:
                print("no schedules made at run time", file=sys.stderr)
                return
            kept = [s for s in listed if _holds(s.name, args.name)]
            if args.state == "left_alone":
                kept = [s for s in kept if not s.known]
            elif args.state is not None:
                seam = seam_of(scheduler)
                named = set(seam.in_state(await seam.cluster(), args.state))
                kept = [s for s in kept if s.known and s.name in named]
            shown = shown_page([s.name for s in kept], args, by_name=True)
            by_name = {s.name: s for s in kept}
            for name in shown:
                print(_listed(by_name[name]))

        return listing
    if scheduler.store is None:
        raise _Refused(
            "this app's scheduler has no store: a schedule made from here would live in "
            "this process only; give it one (Scheduler(store=SQLAlchemyStore(...)))"
        )
    if args.verb == "apply":
        return _applying(scheduler, args.group, _set(args.file))
    name = args.name
    if args.verb == "remove":

        async def removing() -> None:
            await scheduler.remove_schedule(name)
            print(f"schedule {name!r} removed", file=sys.stderr)

        return removing
    schedule = _schedule(args)
    kwargs = _kwargs(args.kwargs)
    options = dict(_option(text) for text in args.option)
    if args.verb == "add":
        assert schedule is not None  # argparse requires --every or --cron

        async def adding() -> None:
            made = await scheduler.add_schedule(name, args.task, schedule, kwargs=kwargs, **options)
            print(json.dumps(made.to_dict()))

        return adding

    async def changing() -> None:
        changed = await scheduler.update_schedule(
            name, task=args.task, schedule=schedule, kwargs=kwargs, **options
        )
        print(json.dumps(changed.to_dict()))

    return changing


def add_filters(parser: argparse.ArgumentParser, listed: str) -> None:
    """The filters and the page of a listing: as the HTTP listings' (``state=``,
    ``q=``, ``limit=``, a cursor), the cursor a name here."""
    parser.add_argument(
        "--state",
        choices=FILTER_STATES,
        help=f"only the {listed} in this state (left_alone: the stored schedules this "
        "app cannot run)",
    )
    parser.add_argument("--name", default="", metavar="TEXT", help="only names holding TEXT")
    parser.add_argument(
        "--limit", type=_limit, default=None, metavar="N", help="at most N (default: all)"
    )
    parser.add_argument(
        "--after", metavar="NAME", help="start after NAME (the last line's name of a page)"
    )


def _limit(text: str) -> int | None:
    if text == "all":
        return None
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError("write a whole number from 1, or all")
    return int(text)


def _holds(name: str, text: str) -> bool:
    return text.casefold() in name.casefold()


def shown_page(names: list[str], args: argparse.Namespace, *, by_name: bool) -> list[str]:
    """Of ``names`` (those the filters keep, in the listing's order), the page
    asked (``--after``, ``--limit``); the count and where the next page starts
    said on stderr, where a pipe does not read it. ``by_name``: the listing is
    by name, and ``--after`` a place in it, whether or not that name is there;
    else it must name one of ``names`` (`ValueError` if not)."""
    start = 0
    if args.after is not None:
        if by_name:
            start = bisect_right(names, args.after)
        elif args.after in names:
            start = names.index(args.after) + 1
        else:
            raise ValueError(f"--after {args.after!r}: no such name here; give the last name shown")
    end = len(names) if args.limit is None else min(len(names), start + args.limit)
    shown = names[start:end]
    if args.limit is not None or args.after is not None or args.state or args.name:
        said = f"{len(shown)} shown of {len(names)}"
        if end < len(names):
            said += f"; the next page: --after {shlex.quote(shown[-1])}"
        print(said, file=sys.stderr)
    return shown


def _listed(stored: StoredSchedule) -> str:
    lines = [
        stored.name,
        f"  task {stored.task}"
        + ("" if stored.known else f": left alone here ({stored.left_alone})"),
        f"  {stored.schedule.describe()}",
        f"  kwargs {json.dumps(shown(stored.kwargs))}",
    ]
    if stored.options:
        lines.append(f"  options {json.dumps(dict(stored.options))}")
    return "\n".join(lines)


def _schedule(args: argparse.Namespace) -> Schedule | None:
    if args.every is not None:
        return Every(seconds=args.every, offset=args.offset)
    if args.cron is not None:
        return Cron(args.cron, tz=args.tz)
    if args.offset or args.tz != "UTC":
        raise _Refused("--offset goes with --every, --tz with --cron")
    return None


def _applying(scheduler: Scheduler, group: str, wanted: list[ScheduleSpec]) -> Callable[[], Any]:
    async def applying() -> None:
        applied = await scheduler.apply_schedules(group, wanted)
        print(json.dumps(applied.to_dict()))

    return applying


def _set(path: str) -> list[ScheduleSpec]:
    """The schedules of ``path`` (``-``: standard input), as PUT /jobs/schedules takes them."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise _Refused(f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise _Refused(f"{path} is not JSON ({exc})") from None
    if (
        not isinstance(data, dict)
        or set(data) != {"schedules"}
        or not isinstance(data["schedules"], list)
    ):
        # As PUT /jobs/schedules takes it: an extra key is a mistake, not a comment.
        raise _Refused(f'{path}: write {{"schedules": [...]}}, one object per schedule')
    wanted = []
    for n, item in enumerate(data["schedules"]):
        try:
            wanted.append(ScheduleSpec.from_dict(item))
        except ConfigurationError as exc:
            raise _Refused(f"{path}: schedules[{n}]: {exc}") from None
    return wanted


def _kwargs(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _Refused(f"--kwargs is not JSON ({exc}): {_KWARGS}") from None
    if not isinstance(value, dict):
        raise _Refused(f"--kwargs is a JSON object: {_KWARGS}")
    return value


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise _Refused(f"--option {text!r}: write KEY=VALUE, e.g. --option retries=2")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value  # a bare word: as a string, which the option's check refuses
