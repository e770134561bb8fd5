"""``python -m tests.mutation [module ...]``: the mutation score of the modules
that decide which tick runs where (docs/development/mutation.md).

mutmut 3 mutates the modules listed in pyproject's ``[tool.mutmut] only_mutate``
(or those named, as paths or dotted names), one module at a time under ``nice``,
each mutant tested by the tests that reach its function alone; then it prints
a table per module: mutants, killed, survived, timed out, no test, not run
yet, the score (killed or timed out, of those run), and the wall time.
``--resume`` runs only the mutants not run yet (a run stopped midway goes on);
``--survivors`` only those that survived the last run (the score after new tests);
``--sample N`` one in N, every Nth in the module's order (the score of a module
too large to run whole in a session);
``--report`` prints the table of the last runs without running anything;
``mutmut results`` lists the survivors, ``mutmut show NAME`` one's diff. Its
working files are in ``mutants/`` (ignored by git)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# mutmut's exit codes, as its ``mutmut.stats.status_by_exit_code`` reads them.
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped"}
STATUS |= dict.fromkeys((36, -24, 24, 152, 255), "timeout")
COLUMNS = ("killed", "survived", "timeout", "no tests", "not run")


def configured() -> list[str]:
    """The modules pyproject's ``[tool.mutmut]`` mutates, as paths."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["mutmut"]["only_mutate"])


def as_path(module: str) -> str:
    """``fastapi_jobs._core.claims`` or its path, as its path."""
    return module if module.endswith(".py") else module.replace(".", "/") + ".py"


def run(path: str, children: int, only: str | None, sample: int) -> float:
    """Mutate one module and test its mutants (``only``: those of that status
    in the last run, "not run" or "survived"; ``sample``: every that many, in
    the module's order); returns the wall time in seconds."""
    dotted = path.removesuffix(".py").replace("/", ".")
    names = [f"{dotted}.*"]
    if (only or sample > 1) and (ROOT / "mutants" / f"{path}.meta").exists():
        found = codes(path)
        names = list(found)[::sample]
        if only:
            names = [name for name in names if status(found[name]) == only]
        if not names:
            return 0.0
    mutmut = Path(sys.executable).with_name("mutmut")
    command = ["nice", "-n", "19", str(mutmut), "run", f"--max-children={children}", *names]
    start = time.monotonic()
    subprocess.run(command, cwd=ROOT, check=False)
    return time.monotonic() - start


def codes(path: str) -> dict[str, int | None]:
    """mutmut's exit code of each of one module's mutants (None: not run)."""
    meta = ROOT / "mutants" / f"{path}.meta"
    try:
        found: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    except (FileNotFoundError, json.JSONDecodeError):  # never run, or cut off mid-write
        return {}
    return found


def status(code: int | None) -> str:
    """The status of a mutant whose last run exited with ``code`` (None: not run)."""
    return STATUS.get(code, "suspicious") if code is not None else "not run"


def counts(path: str) -> Counter[str]:
    """Each status's count among one module's mutants, from mutmut's last run."""
    return Counter(status(code) for code in codes(path).values())


def table(paths: list[str], seconds: dict[str, float]) -> str:
    """A Markdown table: each module's mutants by status, its score, its time."""
    lines = [
        "| module | mutants | killed | survived | timed out | no test | not run | score | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    total: Counter[str] = Counter()
    for path in paths:
        count = counts(path)
        total += count
        lines.append(row(path.removeprefix("fastapi_jobs/"), count, seconds.get(path)))
    lines.append(row("all", total, sum(seconds.values()) if len(seconds) == len(paths) else None))
    return "\n".join(lines)


def row(name: str, count: Counter[str], seconds: float | None) -> str:
    mutants = sum(count.values())
    run = mutants - count["not run"]
    # A timed-out mutant is caught: its tests did not pass. Of those run so far.
    score = (count["killed"] + count["timeout"]) / run if run else 0.0
    cells = [str(count[status]) for status in COLUMNS]
    took = "" if seconds is None else f"{seconds / 60:.1f} min"
    return f"| {name} | {mutants} | {' | '.join(cells)} | {score:.0%} | {took} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__)
    parser.add_argument("modules", nargs="*", help="paths or dotted names; all configured if none")
    # Four on two cores: most tests wait on real time, as the suite's -n 4 does.
    parser.add_argument("--children", type=int, default=4, help="mutants tested at once")
    parser.add_argument("--report", action="store_true", help="print the last runs' table only")
    parser.add_argument("--resume", action="store_true", help="run only the mutants not run yet")
    parser.add_argument(
        "--survivors", action="store_true", help="run again only those that survived"
    )
    parser.add_argument("--sample", type=int, default=1, help="run every SAMPLEth mutant")
    args = parser.parse_args(argv)
    paths = [as_path(module) for module in args.modules] or configured()
    unknown = sorted(set(paths) - set(configured()))
    if unknown:
        parser.error(f"not in [tool.mutmut] only_mutate in pyproject.toml: {', '.join(unknown)}")
    if not args.report and shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
        parser.error("mutmut is not installed here: pip install -e . --group dev")
    times = ROOT / "mutants" / "mutation-times.json"  # each module's last run, for --report
    seconds = json.loads(times.read_text()) if times.exists() else {}
    if args.resume and args.survivors:
        parser.error("--resume or --survivors, not both")
    only = "not run" if args.resume else "survived" if args.survivors else None
    for path in [] if args.report else paths:
        took = run(path, args.children, only, args.sample)
        if took:  # 0: nothing left to run
            seconds[path] = seconds.get(path, 0.0) + took if only else took
        times.parent.mkdir(exist_ok=True)
        times.write_text(json.dumps(seconds, indent=1))
    print(table(paths, {path: seconds[path] for path in paths if path in seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
