"""Schedules made at run time across real instances: three uvicorn processes on
one PostgreSQL database, or on one SQLite file (tests/apps/schedules_app.py).

A schedule made on one instance, changed on a second and removed on a third:
each tick runs once across the three, every instance follows each change, no
tick after a change's answer runs under the old spec, none after a removal's;
after a restart of every instance the schedules are back; an instance whose
code lacks the task leaves them alone. Real time, with intervals of a fraction
of a second (processes share no virtual clock); the host's clock is the
database's here, so the test compares ticks with the store's ``updated_at``.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx
import pytest

from ..support.cluster import App, rows, start
from ..support.ticks import (
    assert_none_left_out,
    dropped_while_held,
    said_of,
    skips,
    warnings,
)
from ..support.waiting import wait_until

APP = "tests.apps.schedules_app:app"
HEARTBEAT = 0.3

Run = tuple[str, str, float, int | None, str]
"""A row of schedule_runs: job, tenant, tick, fence, instance."""


def runs(url: str, job: str | None = None) -> list[Run]:
    sql = "SELECT job, tenant, tick, fence, instance FROM schedule_runs"
    return [r for r in rows(url, sql) if job is None or r[0] == job]


def call(app: App, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, app.base_url + path, timeout=30, **kwargs)


def status(app: App, job: str) -> dict[str, Any] | None:
    """The job's status on ``app``, or None if that instance has no such job."""
    response = call(app, "GET", f"/jobs/{job}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, f"{response.text}\n{app.output()[-6000:]}"
    found: dict[str, Any] = response.json()
    return found


def schedule_is(apps: Sequence[App], job: str, describe: str | None) -> bool:
    """Every instance runs ``job`` on the schedule described so (None: has no such job)."""
    for app in apps:
        found = status(app, job)
        if (None if found is None else found["schedule"]) != describe:
            return False
        if found is not None and found["task"] != "report":
            return False
    return True


def updated_at(url: str, name: str) -> float:
    """When the store's row of ``name`` last changed, on the database's clock."""
    ((at,),) = rows(url, "SELECT updated_at FROM fastapi_jobs_schedules WHERE name = :n", n=name)
    return float(at)


def claimed_at(url: str, job: str) -> dict[int, float]:
    """When each run of ``job`` was claimed, by fence, on the database's clock
    (the store's history). A tick is claimed when the instance's reading of
    that clock comes to it, a few milliseconds either side: a change that lands
    just before a tick may come after its claim, which ran the tick as it was."""
    sql = "SELECT fence, started_at FROM fastapi_jobs_runs WHERE job = :job"
    return {int(fence): float(at) for fence, at in rows(url, sql, job=job)}


def assert_every_tick(
    url: str, apps: Sequence[App], job: str, ticks: Sequence[float], every: float
) -> None:
    """Each of ``ticks`` on ``every``'s grid, and every tick of the grid between the
    first and the last among them run, or accounted for: dropped while the run
    before still held the claim, or claimed by an instance as it stopped."""
    assert ticks, f"{job}: no ticks"
    off = [tick for tick in ticks if abs(tick / every - round(tick / every)) >= 1e-6]
    assert not off, f"{job}: ticks off the grid of {every}s: {off}"
    assert_none_left_out(url, job, list(ticks), every, apps)


def assert_no_tick_twice(url: str) -> None:
    twice = {k: n for k, n in Counter((r[0], r[2]) for r in runs(url)).items() if n > 1}
    assert not twice, f"ticks run more than once: {twice}"


def tried_every_tick(app: App, job: str) -> bool:
    """The instance went for the job's ticks: ran some, or found them claimed elsewhere."""
    found = status(app, job)
    return found is not None and found["runs"] + found["skipped"].get("claimed_elsewhere", 0) > 0


@pytest.mark.slow  # 12-23 s of app processes: .ci/run's slow pass
def test_a_schedule_made_changed_and_removed_on_three_instances_runs_each_tick_once(
    cluster_url: str, apps: list[App]
) -> None:
    """Made on A, it runs once per tick across the three; changed on B (interval and
    kwargs), every instance follows and no tick after the answer runs under the old
    spec; removed on C, no tick after the answer runs; every instance restarted, the
    schedule left is back and runs on."""
    url = cluster_url
    apps.extend(start(url, 3, app=APP, HEARTBEAT=HEARTBEAT))
    a, b, c = apps
    for name, tenant in (("report", "acme"), ("keep", "kept")):
        made = call(
            a,
            "POST",
            "/test/schedules",
            json={"name": name, "every": 0.5, "kwargs": {"tenant": tenant}},
        )
        assert made.status_code == 200, made.text
    wait_until(lambda: schedule_is(apps, "report", "every 0.5s"), timeout=15)
    wait_until(lambda: len(runs(url, "report")) >= 6, timeout=20)

    changed = call(
        b, "PATCH", "/test/schedules/report", json={"every": 0.3, "kwargs": {"tenant": "globex"}}
    )
    assert changed.status_code == 200, changed.text
    changed_at = datetime.fromisoformat(changed.json()["updated_at"]).timestamp()
    wait_until(lambda: schedule_is(apps, "report", "every 0.3s"), timeout=15)
    wait_until(lambda: sum(r[1] == "globex" for r in runs(url, "report")) >= 6, timeout=20)

    removed = call(c, "DELETE", "/test/schedules/report")
    assert removed.status_code == 200, removed.text
    removed_at = updated_at(url, "report")
    wait_until(lambda: schedule_is(apps, "report", None), timeout=15)
    # A run of a tick claimed before the removal would show by the time the
    # schedule left has run a few more.
    kept = len(runs(url, "keep"))
    wait_until(lambda: len(runs(url, "keep")) >= kept + 4, timeout=20)
    assert all(tried_every_tick(app, "keep") for app in apps)

    stopping = time.time()
    for app in apps:
        app.terminate()
    apps.extend(start(url, 3, app=APP, HEARTBEAT=HEARTBEAT))
    started = time.time()
    again = apps[3:]
    wait_until(lambda: schedule_is(again, "keep", "every 0.5s"), timeout=15)
    assert schedule_is(again, "report", None)
    wait_until(lambda: sum(r[2] > started for r in runs(url, "keep")) >= 4, timeout=20)
    for app in again:
        app.terminate()

    assert_no_tick_twice(url)
    report = runs(url, "report")
    old = [tick for _, tenant, tick, *_ in report if tenant == "acme"]
    new = [tick for _, tenant, tick, *_ in report if tenant == "globex"]
    assert len(old) + len(new) == len(report)
    assert_every_tick(url, apps, "report", old, 0.5)
    assert max(old) <= changed_at, (sorted(old), changed_at)  # none under the old spec after
    assert_every_tick(url, apps, "report", new, 0.3)
    assert max(new) <= removed_at, (sorted(new), removed_at)  # none after the removal
    keep = [tick for _, _, tick, *_ in runs(url, "keep")]
    assert_every_tick(url, apps, "keep", [t for t in keep if t <= stopping], 0.5)
    assert_every_tick(url, apps, "keep", [t for t in keep if t > started], 0.5)


@pytest.mark.slow  # 10-20 s of app processes: .ci/run's slow pass
def test_a_set_applied_on_one_instance_while_another_runs_it_runs_each_tick_once(
    cluster_url: str, apps: list[App]
) -> None:
    """A applies a set of 20; both run it, each tick once. B applies it again
    with 10 left out and 5 changed while A runs ticks: no tick of a removed
    schedule after B's call returned (nor before its row says it was removed),
    none under a changed one's old arguments after its change, every other
    tick run once."""
    url = cluster_url
    apps.extend(start(url, 2, app=APP, HEARTBEAT=HEARTBEAT))
    a, b = apps
    every = 0.5

    def made(n: int, tenant: str) -> dict[str, Any]:
        return {"name": f"s{n:02}", "every": every, "kwargs": {"tenant": tenant}}

    first = call(a, "PUT", "/test/sets/g", json=[made(n, "v1") for n in range(20)])
    assert first.status_code == 200, first.text
    assert len(first.json()["created"]) == 20
    wait_until(lambda: all(schedule_is(apps, f"s{n:02}", "every 0.5s") for n in range(20)), 15)
    wait_until(lambda: len({r[0] for r in runs(url)}) == 20 and len(runs(url)) >= 100, 20)

    second = call(
        b, "PUT", "/test/sets/g", json=[made(n, "v2" if n < 5 else "v1") for n in range(10)]
    )
    returned = time.time()  # the host's clock is the database's here
    assert second.status_code == 200, second.text
    assert second.json() == {
        "group": "g",
        "created": [],
        "changed": [f"s{n:02}" for n in range(5)],
        "removed": [f"s{n:02}" for n in range(10, 20)],
        "unchanged": 5,
    }
    b_id = call(b, "GET", "/test/instance").json()
    done = len(runs(url))
    wait_until(lambda: len(runs(url)) >= done + 60, 20)  # A and B go on, ticks of the 10
    for app in apps:
        app.terminate()

    assert_no_tick_twice(url)
    for n in range(20):
        job = f"s{n:02}"
        mine = runs(url, job)
        at = updated_at(url, job)  # the change's or the removal's row
        claimed = claimed_at(url, job)
        when = {r: claimed.get(r[3] or -1, r[2]) for r in mine}  # when each was claimed
        if n >= 10:
            late = [r for r in mine if when[r] > min(at, returned)]
            assert not late, (job, at, returned, late, f"B is {b_id}")
            continue
        old = [r[2] for r in mine if r[1] == "v1"]
        new = [r[2] for r in mine if r[1] == "v2"]
        if n < 5:
            last_old = max(when[r] for r in mine if r[1] == "v1")
            assert last_old <= at and new and min(new) > at - every, (job, old, new, at)
            assert_every_tick(url, apps, job, new, every)
        assert_every_tick(url, apps, job, old, every)


@pytest.mark.slow  # 12-23 s of app processes: .ci/run's slow pass
def test_an_instance_without_the_task_leaves_the_schedules_alone(
    cluster_url: str, apps: list[App]
) -> None:
    """An instance of a release that lacks the task does not run its schedule nor
    delete it, and says so once in its log; the two that have the task run each
    tick once."""
    url = cluster_url
    apps.extend(start(url, 2, app=APP, HEARTBEAT=HEARTBEAT))
    apps.extend(start(url, 1, app=APP, HEARTBEAT=HEARTBEAT, NO_TASK=1))
    a, b, older = apps
    ids = {call(app, "GET", "/test/instance").json() for app in (a, b)}
    made = call(
        a,
        "POST",
        "/test/schedules",
        json={"name": "report", "every": 0.5, "kwargs": {"tenant": "acme"}},
    )
    assert made.status_code == 200, made.text
    said = "schedule 'report' is left alone here"
    wait_until(lambda: said in older.output(), timeout=15)
    # Many heartbeats of the older instance later, while the others run it:
    wait_until(lambda: len(runs(url, "report")) >= 10, timeout=20)
    assert older.output().count(said) == 1, older.output()
    assert "which this instance lacks" in older.output()
    assert status(older, "report") is None
    listed = call(older, "GET", "/test/schedules").json()
    assert [(s["name"], s["known"]) for s in listed] == [("report", False)]
    left = rows(url, "SELECT removed FROM fastapi_jobs_schedules WHERE name = 'report'")
    assert [bool(removed) for (removed,) in left] == [False]  # the row is there, live
    assert all(tried_every_tick(app, "report") for app in (a, b))
    for app in apps:
        app.terminate()
    report = runs(url, "report")
    assert {instance for *_, instance in report} <= ids
    assert_no_tick_twice(url)
    assert_every_tick(url, apps, "report", [tick for _, _, tick, *_ in report], 0.5)


def changed_away(apps: Sequence[App], job: str) -> set[float]:
    """The ticks of ``job`` an instance said it did not run because the schedule
    changed under them (counted ``schedule_changed``)."""
    said = re.compile(rf"job '{job}': tick (\S+) was not run: its schedule changed")
    return {
        datetime.fromisoformat(tick).timestamp()
        for app in apps
        for tick in said.findall(app.output())
    }


@pytest.mark.slow  # 20-30 s of app processes: .ci/run's slow pass
def test_sets_applied_at_once_from_two_clients_lose_no_tick_silently(
    cluster_url: str, apps: list[App]
) -> None:
    """Two clients apply a set of 10 to one group every 0.1 s, each through its
    own instance, each set changing every schedule's arguments (not its ticks),
    while three instances run them. Each tick runs once, under one version or
    another; a tick none of them ran is one an instance said, at INFO, the
    change did not keep (counted schedule_changed), never one each counted as
    claimed elsewhere with no word. (Before, 40 to 80 of 1,500 ticks ran
    nowhere.)"""
    url = cluster_url
    apps.extend(start(url, 3, app=APP, HEARTBEAT=HEARTBEAT))
    every = 0.5

    def the_set(tenant: str) -> list[dict[str, Any]]:
        return [
            {"name": f"s{n:02}", "every": every, "kwargs": {"tenant": tenant}} for n in range(10)
        ]

    assert call(apps[0], "PUT", "/test/sets/g", json=the_set("x")).status_code == 200
    wait_until(lambda: len({r[0] for r in runs(url)}) == 10, 20)
    stop = threading.Event()

    def client(app: App, tenant: str) -> None:
        while not stop.is_set():
            answer = call(app, "PUT", "/test/sets/g", json=the_set(tenant))
            assert answer.status_code == 200, answer.text
            stop.wait(0.1)

    with ThreadPoolExecutor(2) as pool:
        clients = [pool.submit(client, apps[0], "x"), pool.submit(client, apps[1], "y")]
        time.sleep(8)
        stop.set()
        for running in clients:
            running.result()
    time.sleep(1)
    for app in apps:
        app.terminate()

    assert_no_tick_twice(url)
    total = 0
    for n in range(10):
        job = f"s{n:02}"
        ticks = sorted(r[2] for r in runs(url, job))
        total += len(ticks)
        told = changed_away(apps, job)
        held = dropped_while_held(url, job, ticks, every)
        for ran, next_ran in itertools.pairwise(ticks):
            for k in range(1, round((next_ran - ran) / every)):
                tick = ran + k * every
                assert tick in held or any(abs(tick - t) < 1e-3 for t in told), (
                    f"{job}: tick {tick} ran nowhere, and no instance said why\n"
                    f"{skips(apps, job, ran, next_ran)}\n{said_of(apps, job, [tick])}\n"
                    f"{warnings(apps)}"
                )
    assert total >= 10 * 14  # 8 s of ticks every 0.5 s, for each of the 10
    said = "".join(app.output() for app in apps)
    assert "runs under the schedule's new version" in said  # ticks kept were run
