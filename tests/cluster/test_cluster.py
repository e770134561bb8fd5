"""Several real app processes (uvicorn) sharing one real database.

Real time, with intervals of a fraction of a second: processes cannot share a
virtual clock, and leases are decided by the database's clock anyway.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import re
import signal
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from datetime import datetime
from pathlib import Path

import pytest

from ..apps.race import race
from ..support.cluster import App, rows, start
from ..support.postgres import PostgresServer
from ..support.ticks import assert_none_left_out, claimed_as_stopping
from ..support.waiting import wait_until


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    return postgres.url(postgres.create_database())


Run = tuple[str, float, int, str, int, float, float | None]
"""A row of the runs table: job, tick, fence, instance, pid, started, finished."""


def runs(url: str) -> list[Run]:
    return rows(url, "SELECT job, tick, fence, instance, pid, started, finished FROM runs")


def assert_one_run_per_tick(
    url: str, apps: Sequence[App] = (), *, lost_answers: bool = False
) -> list[Run]:
    """No (job, tick) ran twice; and unless the database dropped answers
    (``lost_answers``: a claim made whose reply never arrived), every claim ran,
    but for a tick claimed as its instance stopped, before its run began: that one
    is released unrun (no run, so no history row), and its instance's log says so."""
    all_runs = runs(url)
    per_tick = Counter((job, tick) for job, tick, *_ in all_runs)
    twice = {key: n for key, n in per_tick.items() if n > 1}
    assert not twice, f"ticks run more than once: {twice}"
    if lost_answers:
        return all_runs
    for job in {r[0] for r in all_runs}:
        fences = sorted(r[2] for r in all_runs if r[0] == job)
        unstarted = set(claimed_as_stopping(apps, job).values())
        claimed = [f for f in range(fences[0], fences[-1] + 1) if f not in unstarted]
        assert fences == claimed, "a claim without a run"
    return all_runs


@pytest.mark.slow  # 5-6 s a database of three app processes: .ci/run's slow pass
def test_many_jobs_across_three_processes_run_each_tick_once(
    cluster_url: str, apps: list[App]
) -> None:
    """5 jobs at 500 ms in 3 processes started at different moments: one run per (job, tick),
    and no tick between the first and the last is left out but for a run in flight."""
    for _ in range(3):
        apps.append(App(cluster_url, JOBS=5, INTERVAL=0.5, TIMEOUT=2))
        time.sleep(0.7)
    for app in apps:
        app.wait_started()

    def shared() -> bool:
        # Eight runs of each job, however long a loaded machine takes; and the work
        # shared, though one instance may win every claim for a while.
        found = runs(cluster_url)
        each = Counter(r[0] for r in found)
        return len({r[3] for r in found}) >= 2 and all(each[f"job{n}"] >= 8 for n in range(5))

    wait_until(shared, timeout=30)
    for app in apps:
        app.terminate()
    all_runs = assert_one_run_per_tick(cluster_url, apps)
    for job in (f"job{n}" for n in range(5)):
        ticks = [tick for j, tick, *_ in all_runs if j == job]
        assert len(ticks) >= 8
        assert_none_left_out(cluster_url, job, ticks, 0.5, apps)


@pytest.mark.parametrize(
    ("database_url", "rounds"),
    [("asyncpg", 1000), ("psycopg", 300), ("sqlite", 300)],
    indirect=["database_url"],
)
@pytest.mark.slow  # minutes of real processes: CI's second run (pytest -m slow)
def test_eight_processes_race_for_each_tick_and_one_wins(
    database_url: str, rounds: int, tmp_path: Path
) -> None:
    """8 processes claim the same tick at once, round after round: exactly one winner
    each time, and the fence grows by one per win."""
    url = database_url
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(8)
    outs = [tmp_path / f"won{i}.json" for i in range(8)]
    workers = [ctx.Process(target=race, args=(url, rounds, barrier, str(out))) for out in outs]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=240)
        assert worker.exitcode == 0
    wins = sorted(tuple(w) for out in outs for w in json.loads(out.read_text()))
    assert [tick for tick, _ in wins] == list(range(1, rounds + 1))  # one winner per tick
    assert [fence for _, fence in wins] == list(range(1, rounds + 1))  # fences strictly grow


def holder_of_a_running_job(url: str, apps: list[App]) -> tuple[App, Run]:
    """Wait until some process is mid-run; that process and its run row."""
    found: list[Run] = []

    def running() -> bool:
        found[:] = [r for r in runs(url) if r[6] is None]
        return bool(found)

    wait_until(running, timeout=30)
    run = found[0]
    [app] = [a for a in apps if a.pid == run[4]]
    return app, run


def test_sigkill_mid_run_the_tick_is_not_run_again_and_a_survivor_takes_over(
    pg_url: str, apps: list[App]
) -> None:
    """The holder dies mid-run (SIGKILL): its tick never runs again; once its lease
    expires, the next tick runs on a survivor."""
    apps += start(pg_url, 3, INTERVAL=0.25, RUN_SECONDS=0.8, LEASE=1.5, TIMEOUT=0.4)
    victim, run = holder_of_a_running_job(pg_url, apps)
    job, tick = run[0], run[1]
    killed_at = time.time()  # before the signal: a stall here only makes it earlier
    victim.signal(signal.SIGKILL)
    wait_until(lambda: any(r[0] == job and r[1] > tick for r in runs(pg_url)), timeout=15)
    for app in apps:
        if app is not victim:
            app.terminate()
    all_runs = assert_one_run_per_tick(pg_url, apps)
    assert [r for r in all_runs if (r[0], r[1]) == (job, tick)] == [run]  # never run again
    after = [r for r in all_runs if r[0] == job and r[1] > tick]
    assert all(r[4] != victim.pid for r in after)
    # The survivor claimed only once the dead holder's lease had run out: renewed a
    # third of the lease (0.5 s) before the kill at the latest, it held 1 s more.
    assert min(r[5] for r in after) >= killed_at + 0.3


@pytest.mark.slow  # 7-14 s of app processes: .ci/run's slow pass
def test_sigstop_past_the_lease_cancels_the_run_and_its_stale_writes_are_rejected(
    pg_url: str, apps: list[App]
) -> None:
    """The holder is paused (SIGSTOP) longer than its lease: a peer takes the job with a
    higher fence; when the holder resumes its run is cancelled, and a write guarded by
    its stale fence is rejected."""
    apps += start(pg_url, 2, INTERVAL=0.25, RUN_SECONDS=2.5, LEASE=0.9, TIMEOUT=0.25)
    holder, run = holder_of_a_running_job(pg_url, apps)
    job, stale_fence = run[0], run[2]
    holder.signal(signal.SIGSTOP)
    time.sleep(2.0)  # more than twice the lease
    holder.signal(signal.SIGCONT)
    resumed_at = time.time()
    time.sleep(1.0)
    for app in apps:
        app.terminate()
    assert "lost its lease" in holder.output()
    all_runs = assert_one_run_per_tick(pg_url, apps)
    newer = [r for r in all_runs if r[0] == job and r[2] > stale_fence]
    assert newer, "no peer took over"
    taken_at = min(r[5] for r in newer)
    assert [r[6] for r in all_runs if r[2] == stale_fence] == [None]  # never finished
    # No write with the stale fence got through once the peer had claimed.
    late = rows(
        pg_url,
        "SELECT at FROM writes WHERE job = :job AND fence = :fence AND at > :taken",
        job=job,
        fence=stale_fence,
        taken=taken_at,
    )
    assert late == []
    # And one attempted now, as the resumed run would, is rejected by the guard.
    attempted = rows(
        pg_url,
        "INSERT INTO writes SELECT CAST(:job AS VARCHAR), CAST(:fence AS BIGINT), 'stale', 0 "
        "WHERE EXISTS (SELECT 1 FROM fastapi_jobs_claims WHERE job = CAST(:job AS VARCHAR) "
        "AND fence = CAST(:fence AS BIGINT)) RETURNING fence",
        job=job,
        fence=stale_fence,
    )
    assert attempted == []
    assert resumed_at > taken_at


@pytest.mark.slow  # 9-16 s of processes: .ci/run's slow pass
def test_a_run_longer_than_its_lease_is_not_run_twice(pg_url: str, apps: list[App]) -> None:
    """Runs of 2.5 s under a 1.2 s lease in 3 processes: renewals keep them; runs of one
    job never overlap and no tick repeats. (With a 0.6 s lease it failed once on a
    loaded 2-core machine, its output lost; a renewal late by a 0.4 s stall is the
    likely cause: the margins are wider now.)"""
    apps += start(pg_url, 3, JOBS=2, INTERVAL=0.25, RUN_SECONDS=2.5, LEASE=1.2, TIMEOUT=0.3)
    time.sleep(5)
    for app in apps:
        app.terminate()
    all_runs = assert_one_run_per_tick(pg_url, apps)
    for job in ("job0", "job1"):
        spans = sorted((r[5], r[6]) for r in all_runs if r[0] == job)
        assert len(spans) >= 2
        assert all(end is not None for _, end in spans[:-1])
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))  # type: ignore[operator]
    assert all("lost its lease" not in app.output() for app in apps)


@pytest.mark.slow  # 9-16 s of processes: .ci/run's slow pass
def test_database_restarts_during_claims_renewals_and_releases(
    postgres: PostgresServer, apps: list[App]
) -> None:
    """PostgreSQL restarts three times under load: no tick runs twice, and runs resume."""
    url = postgres.url(postgres.create_database())
    apps += start(url, 3, JOBS=3, INTERVAL=0.2, RUN_SECONDS=0.35, LEASE=0.9, TIMEOUT=0.25)
    time.sleep(1)
    for pause in (0.3, 0.7, 0.45):
        postgres.restart()
        time.sleep(pause)
    restarted_at = time.time()
    time.sleep(1.5)
    for app in apps:
        app.terminate()
    # A claim sent as the server went down may be made without its reply
    # arriving: that tick is skipped (at most once), never run twice.
    all_runs = assert_one_run_per_tick(url, apps, lost_answers=True)
    assert [r for r in all_runs if r[5] > restarted_at + 0.3], "runs did not resume"


@pytest.mark.slow  # 12-23 s of app processes: .ci/run's slow pass
def test_skewed_clocks_do_not_change_outcomes(cluster_url: str, apps: list[App]) -> None:
    """A process 3 s ahead joins one on time, then one 2 s behind joins: still one run
    per tick, and no tick left out (the one ahead does not claim ticks early)."""
    for offset in (0, 3, -2):
        app = App(cluster_url, JOBS=2, INTERVAL=0.25, CLOCK_OFFSET=offset, TIMEOUT=2)
        apps.append(app)
        app.wait_started()
        time.sleep(1)

    def twelve_each() -> bool:  # however long a loaded machine takes
        each = Counter(r[0] for r in runs(cluster_url))
        return min(each["job0"], each["job1"]) >= 12

    wait_until(twelve_each, timeout=30)
    for app in apps:
        app.terminate()
    all_runs = assert_one_run_per_tick(cluster_url, apps)
    for job in ("job0", "job1"):
        ticks = sorted(r[1] for r in all_runs if r[0] == job)
        assert len(ticks) >= 12
        assert_none_left_out(cluster_url, job, ticks, 0.25, apps)
        late = [r[5] - r[1] for r in all_runs if r[0] == job and r[5] < r[1] - 0.1]
        assert not late, f"{job}: ran before its tick: {late}"


def restart_after_downtime(url: str, apps: list[App], catch_up: float) -> tuple[App, float, float]:
    """Run one instance, stop it for ~10 ticks, start another; return the new
    instance, when the first stopped, and when the second's scheduler started
    (the database's time of its first heartbeat)."""
    first = App(url, INTERVAL=0.25, CATCH_UP=catch_up)
    apps.append(first)
    first.wait_started()
    time.sleep(0.8)
    first.terminate()
    stopped_at = max(r[1] for r in runs(url))
    time.sleep(2.5)
    again = App(url, INTERVAL=0.25, CATCH_UP=catch_up)
    apps.append(again)
    again.wait_started()
    # Its first run (the catch-up, if any: the job's task runs it before any
    # tick), however long the first claim takes on a loaded machine; then a
    # moment in which an older missed tick, wrongly run, would show.
    wait_until(lambda: any(r[4] == again.pid for r in runs(url)), timeout=15)
    time.sleep(0.3)
    again.signal(signal.SIGKILL)  # keeps its instance row, with its start time
    again.proc.wait(timeout=10)
    [(started_at,)] = rows(url, "SELECT started_at FROM fastapi_jobs_instances")
    return again, stopped_at, started_at


@pytest.mark.slow  # 9-16 s of processes: .ci/run's slow pass
def test_downtime_across_many_ticks_gives_one_catch_up_run(pg_url: str, apps: list[App]) -> None:
    """Down for ~10 ticks, catch_up=5 s: the latest missed tick runs once, at start."""
    again, stopped_at, started_at = restart_after_downtime(pg_url, apps, catch_up=5)
    assert_one_run_per_tick(pg_url, apps)
    said = re.search(r"missed while down; catching up on the latest, (\S+)", again.output())
    assert said, f"no catch-up; the instance said:\n{again.output()}"
    caught_up = datetime.fromisoformat(said.group(1)).timestamp()
    # The catch-up tick ran, and none of the older missed ticks did. (A window
    # of ticks around the start cannot tell it from the first regular tick.)
    ran = [r[1] for r in runs(pg_url) if stopped_at < r[1] <= caught_up + 0.001]
    assert ran == [pytest.approx(caught_up, abs=0.001)], f"runs while down: {ran}"
    assert started_at - caught_up < 0.25 + 0.02  # the latest of the missed ticks


@pytest.mark.slow  # 9-16 s of processes: .ci/run's slow pass
def test_no_catch_up_past_the_deadline(pg_url: str, apps: list[App]) -> None:
    """The same downtime with a deadline shorter than any tick's age: no catch-up run."""
    again, stopped_at, started_at = restart_after_downtime(pg_url, apps, catch_up=0.000001)
    missed = [r[1] for r in runs(pg_url) if stopped_at < r[1] < started_at - 0.02]
    assert missed == []
    assert "catching up" not in again.output()


def test_graceful_stop_of_the_holder_lets_a_peer_run_the_next_tick_on_time(
    pg_url: str, apps: list[App]
) -> None:
    """SIGTERM to the holder of a long run (30 s lease): it releases the claim, and the
    peer runs the next tick at once instead of 30 s later."""
    apps += start(pg_url, 2, INTERVAL=0.25, RUN_SECONDS=20, SHUTDOWN_TIMEOUT=0.2)
    holder, run = holder_of_a_running_job(pg_url, apps)
    signalled_at = time.time()
    holder.terminate()  # returns once the process has exited
    [peer] = [a for a in apps if a is not holder]

    def later() -> list[Run]:
        # The peer may claim as soon as the holder releases, before the holder's
        # process has finished exiting: count from the signal.
        return [r for r in runs(pg_url) if r[4] == peer.pid and r[5] > signalled_at]

    wait_until(lambda: bool(later()), timeout=15)
    peer.signal(signal.SIGKILL)  # its own 20 s run needs no draining
    # Released by the stop, not waited out: the peer ran the next tick before the
    # holder's 20 s run would have ended, let alone its 30 s lease.
    assert min(r[5] for r in later()) < run[5] + 20
    assert all(r[1] > run[1] for r in later())
    assert "cancelling it" in holder.output()


@pytest.mark.slow  # minutes of real processes: CI's second run (pytest -m slow)
def test_after_a_long_outside_lock_sqlite_workers_recover_within_a_timeout(
    tmp_path: Path, apps: list[App]
) -> None:
    """Three workers on one SQLite file, 10 jobs writing each second, an outside
    BEGIN EXCLUSIVE held for 8 s (many store timeouts): within about one store
    timeout of the lock's end, an outside write goes through and runs resume."""
    import sqlite3

    path = tmp_path / "locked.sqlite3"
    url = f"sqlite+aiosqlite:///{path}"
    apps.extend(start(url, 3, JOBS=10, INTERVAL=1, TIMEOUT=1, LEASE=10))
    wait_until(lambda: len(runs(url)) >= 10, timeout=30)
    locker = sqlite3.connect(path, timeout=5, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    time.sleep(8)
    locker.execute("COMMIT")
    locker.close()
    unlocked = time.time()

    def outside_write() -> bool:
        try:
            with closing(sqlite3.connect(path, timeout=0.2)) as conn, conn:
                conn.execute("INSERT INTO writes VALUES ('probe', 0, 'test', 0)")
            return True
        except sqlite3.OperationalError:
            return False

    wait_until(outside_write, timeout=6)  # one timeout, and a wide margin
    wait_until(lambda: any(started > unlocked + 1 for *_, started, _ in runs(url)), timeout=6)
    assert_one_run_per_tick(url, apps, lost_answers=True)
