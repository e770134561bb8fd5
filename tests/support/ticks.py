"""What the multi-instance tests read to account for each tick of a job: ran,
dropped while the run before still held the job's claim, or claimed by an
instance as it stopped (released unrun, as its log says)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from datetime import UTC, datetime

from .cluster import App, rows


def claimed_as_stopping(apps: Sequence[App], job: str) -> dict[float, int]:
    """The ticks of ``job`` (and their fences) an instance claimed as it stopped,
    before their run began: released unrun, as its log says, and by then the
    other instances had passed them (a lost tick, as docs/guides/instances.md says)."""
    said = re.compile(rf"job '{job}': tick (\S+) \(fence (\d+)\) was claimed as the app stopped")
    return {
        datetime.fromisoformat(tick).timestamp(): int(fence)
        for app in apps
        for tick, fence in said.findall(app.output())
    }


def assert_none_left_out(
    url: str, job: str, ticks: list[float], interval: float, apps: Sequence[App] = ()
) -> None:
    """Every tick of ``job`` between the first and the last of ``ticks`` (the ticks
    run) ran, or came due while the run before it still held the job's claim:
    dropped, not queued; or was claimed by an instance as it stopped (released
    unrun). (A run can outlast its interval on a loaded machine, waiting for
    SQLite's lock; the store's history has when each run released. Instances
    agree on the database's time to within a few milliseconds: a tick due just
    after a release may have been claimed just before it.)"""
    unrun = claimed_as_stopping(apps, job)
    held = dropped_while_held(url, job, ticks, interval)
    for ran, next_ran in itertools.pairwise(sorted(ticks)):
        left_out = [ran + k * interval for k in range(1, round((next_ran - ran) / interval))]
        unexplained = [
            tick
            for tick in left_out
            if tick not in held and not any(abs(tick - t) < 1e-3 for t in unrun)
        ]
        assert not unexplained, (
            f"{job}: ticks left out after {ran}: {unexplained}; "
            f"claimed as an instance stopped: {sorted(unrun)}; "
            f"the instances skipped:\n{skips(apps, job, ran, next_ran)}\n"
            f"the instances said of them:\n{said_of(apps, job, unexplained)}\n"
            f"the instances warned:\n{warnings(apps)}"
        )


def said_of(apps: Sequence[App], job: str, ticks: Sequence[float]) -> str:
    """What the instances logged of ``job``'s ``ticks`` (a claim released unrun,
    a tick handed to a schedule's new version), for a failure to show."""
    named = [datetime.fromtimestamp(tick, UTC).isoformat() for tick in ticks]
    return "\n".join(
        f"{app.pid}: {line}"
        for app in apps
        for line in app.output().splitlines()
        if f"'{job}'" in line and any(at in line for at in named)
    )


def skips(apps: Sequence[App], job: str, since: float, until: float) -> str:
    """The ticks of ``job`` from ``since`` to ``until`` that each instance did not
    run, with its reason (as the apps' `tests.apps.telling` observer logs them),
    for a failure to say which branch dropped a tick."""
    said = re.compile(rf"skip {re.escape(job)} (\S+) (\w+) (\d+)$", re.MULTILINE)
    return "\n".join(
        f"{app.pid}: {tick} {reason} x{count}"
        for app in apps
        for tick, reason, count in said.findall(app.output())
        if tick == "-" or since - 1e-3 <= float(tick) <= until + 1e-3
    )


def warnings(apps: Sequence[App]) -> str:
    """What the instances logged at WARNING and above, for a failure to show."""
    return "\n".join(
        f"{app.pid}: {line}"
        for app in apps
        for line in app.output().splitlines()
        if line.startswith(("WARNING", "ERROR"))
    )


def dropped_while_held(url: str, job: str, ticks: Sequence[float], interval: float) -> set[float]:
    """The ticks of ``job`` between those run (``ticks``) that came due while
    the run before them still held the job's claim: dropped, not queued, as the
    docs promise. At a 1 s interval a hand-off's send can outlast the interval
    on a loaded machine (CI saw it); the store's history says when each run
    released (instances agree on the database's time to a few milliseconds)."""
    released = dict(
        rows(url, "SELECT tick, finished_at FROM fastapi_jobs_runs WHERE job = :job", job=job)
    )
    return {
        ran + k * interval
        for ran, next_ran in itertools.pairwise(sorted(ticks))
        for k in range(1, round((next_ran - ran) / interval))
        if ran + k * interval <= released.get(ran, -1.0) + 0.02
    }


def refused_after_a_dead_claimer(chosen: float, interval: float, lease: float) -> set[float]:
    """The ticks after ``chosen`` (a hand-off tick whose claimer died holding it)
    that may be refused to every instance: those due while the dead claim's
    lease holds, or while a peer claims the abandoned tick again and hands it
    off. A peer watches the row from its first claim refused (a tick after the
    dead claim), and claims it again a lease after that (and a margin of at most
    a second, and round trips)."""
    return {chosen + k * interval for k in range(1, int((interval + lease + 1.5) / interval) + 1)}


def after_a_dead_claimer(chosen: float, interval: float, lease: float) -> float:
    """A tick two intervals past those `refused_after_a_dead_claimer`: every
    tick up to it is to be run, but those."""
    return chosen + interval * (int((interval + lease + 1.5) / interval) + 2)
