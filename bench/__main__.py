"""``python -m bench``: every implementation, each in a fresh process, side by side.

Writes the results table to BENCHMARKS.md (``--out``). ``--quick`` runs a tiny
N once, for the smoke test. Medians of ``--repeat`` runs; ratios to the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

IMPLS = ["minimal", "floor", "fastapi_jobs", "apscheduler", "repeat_every"]
UVLOOP_IMPLS = ["minimal", "fastapi_jobs"]
ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], timeout: float = 600) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    merged = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, float):
            merged[key] = statistics.median(r[key] for r in results)
        elif isinstance(value, int) and key not in ("n", "ticks_expected"):
            merged[key] = min(r[key] for r in results)  # the worst run counts
    return merged


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()} "
        f"on {platform.system()} {platform.release()}"
    )


def fmt(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="tiny N, one run (smoke test)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument(
        "--uvloop-impls", default=",".join(UVLOOP_IMPLS), help="also run these on uvloop"
    )
    parser.add_argument("--claims", action="store_true", help="also the PostgreSQL claims run")
    parser.add_argument("--requests", action="store_true", help="also the request-latency run")
    parser.add_argument("--out", default=None, help="write the Markdown table here")
    args = parser.parse_args()
    sizes = [20] if args.quick else [int(n) for n in args.sizes.split(",")]
    repeat = 1 if args.quick else args.repeat
    window = 1 if args.quick else args.window
    idle_n = 20 if args.quick else 10_000
    impls = args.impls.split(",")
    variants = [(impl, "asyncio") for impl in impls]
    if not args.quick:
        variants += [(impl, "uvloop") for impl in args.uvloop_impls.split(",") if impl]

    started = time.time()
    ticks: dict[tuple[str, int, str], dict[str, Any]] = {}
    idle: dict[str, dict[str, Any]] = {}
    for n in sizes:
        rounds: dict[tuple[str, str], list[dict[str, Any]]] = {v: [] for v in variants}
        for _ in range(repeat):  # rounds interleaved: drifts of the machine hit all alike
            for impl, loop in variants:
                command = ["bench.worker", "ticks", impl, str(n), "--window", str(window)]
                rounds[impl, loop].append(run([*command, "--loop", loop]))
        for (impl, loop), runs in rounds.items():
            ticks[impl, n, loop] = medians(runs)
            print(json.dumps(ticks[impl, n, loop]), flush=True)
    for impl in impls:
        runs = [
            run(["bench.worker", "idle", impl, str(idle_n), "--window", str(window)])
            for _ in range(repeat)
        ]
        idle[impl] = medians(runs)
        print(json.dumps(idle[impl]), flush=True)
    extra: list[str] = []
    if args.claims:
        from .claims import report as claims_report

        extra += [*claims_report(quick=args.quick), ""]
    if args.requests:
        from .requests import report as requests_report

        extra += [*requests_report(quick=args.quick), ""]
    text = render(
        ticks, idle, sizes, variants, impls, idle_n, repeat, window, extra, time.time() - started
    )
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


def render(
    ticks: dict[tuple[str, int, str], dict[str, Any]],
    idle: dict[str, dict[str, Any]],
    sizes: list[int],
    variants: list[tuple[str, str]],
    impls: list[str],
    idle_n: int,
    repeat: int,
    window: int,
    extra: list[str],
    took: float,
) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Machine: {machine()}. Medians of {repeat} runs, rounds interleaved, each",
        f"implementation in a fresh process; {window} s windows after 2 s of warm-up, with the",
        "garbage of starting up collected (`gc.collect()`) just before each window, for every",
        "implementation alike: the figures are the steady state of a scheduler that has run for",
        "a while. Single machine, noisy: ratios to the floor are the claims, not the absolute",
        "times. The floor is `minimal`, a hand-written asyncio loop per job that sleeps to its",
        "next tick by adding the interval (the physical limit of asyncio for N independent",
        "periodic coroutines); `floor` is the same loop computing its tick on the epoch grid.",
        "",
        "Reproduce: `.venv/bin/pip install -e '.[postgres]' --group bench && "
        ".venv/bin/python -m bench --claims --requests --out BENCHMARKS.md`",
        "",
        "## N interval jobs at 1 s, trivial async body",
        "",
        "| impl | loop | N | CPU µs/tick | × minimal | late p50 ms | late p99 ms | late max ms "
        "| p99 × minimal | ticks run / expected | KiB/job | register+start ms | stop ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        for impl, loop in variants:
            r = ticks[impl, n, loop]
            floor = ticks.get(("minimal", n, loop))
            cpu_ratio = r["cpu_us_per_tick"] / floor["cpu_us_per_tick"] if floor else float("nan")
            p99_ratio = r["late_p99_ms"] / floor["late_p99_ms"] if floor else float("nan")
            lines.append(
                f"| {impl} | {loop} | {n:,} | {fmt(r['cpu_us_per_tick'])} | {fmt(cpu_ratio, 2)} "
                f"| {fmt(r['late_p50_ms'])} | {fmt(r['late_p99_ms'])} | {fmt(r['late_max_ms'])} "
                f"| {fmt(p99_ratio, 2)} | {r['ticks_run']:,} / {r['ticks_expected']:,} "
                f"| {fmt(r['mem_kib_per_job'], 2)} | {fmt(r['start_ms'])} "
                f"| {fmt(r['stop_busy_ms'])} |"
            )
    lines += [
        "",
        f"## {idle_n:,} jobs at 1 h, a window with no tick due",
        "",
        "| impl | CPU while idle, % of one core | stop with all idle, ms |",
        "|---|---|---|",
    ]
    for impl in impls:
        r = idle[impl]
        lines.append(f"| {impl} | {fmt(r['idle_cpu_pct'], 3)} | {fmt(r['stop_idle_ms'])} |")
    lines += ["", *extra, "", f"(The whole run took {took / 60:.1f} minutes.)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
