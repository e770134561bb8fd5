"""Every complete Python block of the README and of each docs page runs as written;
the others say on their first line that they are fragments."""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from fastapi_jobs import (
    AppliedSchedules,
    ClusterJobStatus,
    JobStatus,
    LeaseLostError,
    Scheduler,
)
from fastapi_jobs._distribution import NAME
from fastapi_jobs._dynamic.stored import ScheduleOptions
from fastapi_jobs._job import DEFAULTS

from ..conftest import serve
from ..support.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEXTS = {page: page.read_text() for page in PAGES}
README = TEXTS[ROOT / "README.md"]


def page(name: str) -> str:
    """A docs page's text: ``page("guides/jobs")`` is docs/guides/jobs.md."""
    return TEXTS[ROOT / "docs" / f"{name}.md"]


def blocks(language: str) -> list[tuple[Path, str]]:
    """Every fenced block of ``language`` on every page: (page, code)."""
    pattern = re.compile(rf"^```{language}\n(.*?)^```", re.DOTALL | re.MULTILINE)
    return [(path, code) for path, text in TEXTS.items() for code in pattern.findall(text)]


def docstring_blocks() -> list[tuple[Path, str]]:
    """The Python blocks of the library's docstrings, which the API reference shows."""
    pattern = re.compile(r"^( *)```python\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
    return [
        (path, textwrap.dedent(indent_and_code[1]))
        for path in sorted((ROOT / "fastapi_jobs").rglob("*.py"))
        for indent_and_code in pattern.findall(path.read_text())
    ]


BLOCKS = blocks("python") + docstring_blocks()
COMPLETE = [
    (path, code)
    for path, code in BLOCKS
    if not code.startswith(("# fragment", "# test", "# app module:"))
]
MODULES = [(path, code) for path, code in BLOCKS if code.startswith("# test module:")]
CONFTESTS = {path: code for path, code in BLOCKS if code.startswith("# test conftest:")}
"""A page's ``conftest.py`` (at most one a page), beside each test module it shows."""
APP_MODULES: dict[Path, list[tuple[str, str]]] = {}
"""A page's modules of the reader's app (``# app module: main.py``), beside each
test module it shows, under their names."""
for _path, _code in BLOCKS:
    if _code.startswith("# app module:"):
        _name = _code.splitlines()[0].removeprefix("# app module:").split()[0]
        APP_MODULES.setdefault(_path, []).append((_name, _code))


def test_the_pages_have_complete_blocks_and_mark_the_others() -> None:
    """The README's example and the pages' examples are complete; fragments say so,
    and say what they are a fragment of."""
    assert len(COMPLETE) >= 6
    assert any(path.name == "README.md" for path, _ in COMPLETE)
    assert any(path.suffix == ".py" for path, _ in BLOCKS)  # the docstrings' too
    assert MODULES
    for path, code in BLOCKS:
        apps = [shown for _, shown in APP_MODULES.get(path, [])]
        if (path, code) not in COMPLETE + MODULES and CONFTESTS.get(path) != code:
            assert code in apps or re.match(r"# fragment: \S", code), f"{path.name}: {code[:80]!r}"


@pytest.mark.parametrize(
    ("path", "code"), MODULES, ids=[f"{path.stem}-{k}" for k, (path, _) in enumerate(MODULES)]
)
def test_a_test_module_shown_passes_under_pytest(path: Path, code: str, tmp_path: Path) -> None:
    """A block that is a test module (`# test module: ...`) passes as a user's suite
    runs it: its own pytest process, in a folder of its own (with the page's
    ``conftest.py``, if it shows one), with pytest's and pytest-asyncio's
    defaults (strict mode), warnings as errors, and every test in it passing."""
    (tmp_path / "test_shown.py").write_text(code)
    if path in CONFTESTS:
        (tmp_path / "conftest.py").write_text(CONFTESTS[path])
    for name, module in APP_MODULES.get(path, []):
        (tmp_path / name).write_text(module)
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "-W",
            "error",
            "test_shown.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    tests = len(re.findall(r"^(?:async )?def test_", code, re.M))
    assert re.search(rf"\b{tests} passed\b", ran.stdout), ran.stdout


@pytest.mark.parametrize(
    ("path", "code"),
    COMPLETE,
    ids=[f"{path.stem}-{k}" for k, (path, _) in enumerate(COMPLETE)],
)
async def test_a_complete_block_runs(
    path: Path, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block runs in a fresh namespace (SQLite files in a temporary folder); its
    app serves /jobs behind its auth (or its metrics), and each of its jobs runs once."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    await run_block(path, code, tmp_path, monkeypatch)


ON_DATABASE_URL = [(path, code) for path, code in COMPLETE if 'environ.get("DATABASE_URL"' in code]


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
@pytest.mark.parametrize(
    ("path", "code"),
    ON_DATABASE_URL,
    ids=[f"{path.stem}-{k}" for k, (path, _) in enumerate(ON_DATABASE_URL)],
)
async def test_a_block_that_reads_database_url_runs_on_postgresql(
    path: Path,
    code: str,
    driver: str,
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block that takes the app's database from DATABASE_URL works on PostgreSQL
    too, its SQL included (the first app's once compared a TEXT column with a
    timestamp, which SQLite allows and PostgreSQL refuses)."""
    assert ON_DATABASE_URL
    monkeypatch.setenv("DATABASE_URL", postgres.url(postgres.create_database(), driver=driver))
    await run_block(path, code, tmp_path, monkeypatch)


async def run_block(path: Path, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a complete block as its page's reader would, and check what it serves."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBS_TOKEN", "readme-token")
    namespace: dict[str, object] = {"__name__": "docs_block"}
    exec(compile(code, str(path.relative_to(ROOT)), "exec"), namespace)
    scheduler = namespace["scheduler"]
    assert isinstance(scheduler, Scheduler) and scheduler.jobs
    app = namespace.get("app")
    if isinstance(app, FastAPI):
        async with serve(app) as client:
            if "fastapi_jobs.metrics" in code:  # the metrics example: its jobs' figures there
                answer = await client.get("/metrics")
                assert answer.status_code == 200  # not a redirect to /metrics/
                scraped = answer.text
                for name in scheduler.jobs:
                    assert f'fastapi_jobs_interval_seconds{{job_name="{name}"}}' in scraped
            else:
                for where in ("/jobs", "/jobs/ui"):
                    refused = await client.get(where)
                    assert refused.status_code == 401
                    # A browser asks for a password: its Basic login opens the page.
                    assert refused.headers["www-authenticate"].startswith("Basic")
                    wrong = await client.get(where, auth=("admin", "not-the-token"))
                    assert wrong.status_code == 401
                page = await client.get("/jobs/ui", auth=("admin", "readme-token"))
                assert page.status_code == 200
                logins: list[dict[str, Any]] = [{"auth": ("admin", "readme-token")}]
                if "HTTPBearer" in code:
                    logins.append({"headers": {"Authorization": "Bearer readme-token"}})
                for login in logins:
                    listed = await client.get("/jobs", **login)
                    assert listed.status_code == 200
                    assert [job["name"] for job in listed.json()] == sorted(scheduler.jobs)
            results = [await scheduler.run_now(name) for name in scheduler.jobs]
    else:
        async with scheduler.running():
            results = [await scheduler.run_now(name) for name in scheduler.jobs]
    for value in namespace.values():
        if isinstance(value, AsyncEngine):
            await value.dispose()  # a module-level engine is the app's to close
    for result in results:
        # A run by hand has no claim, so a write fenced by it is refused, as documented.
        assert result.ok or isinstance(result.error, LeaseLostError), result.error


INSTALL = re.compile(r"pip install ((?:(?:-e|--\S+) )*)('[^']*'|\S+)")


def installs() -> list[tuple[str, str]]:
    """Every `pip install` the README and the library's messages tell users to run:
    (where, what it installs)."""
    found = [
        (path.name, m.group(2)) for path, text in TEXTS.items() for m in INSTALL.finditer(text)
    ]
    for path in sorted((ROOT / "fastapi_jobs").rglob("*.py")):
        if path.name == "_distribution.py":
            continue  # its hint is formatted: test_packaging checks what it says
        text = path.read_text()
        found += [(path.name, m.group(2)) for m in INSTALL.finditer(text)]
    return found


def test_every_install_command_installs_this_project() -> None:
    """`pip install 'fastapi-jobs[...]'` installed another project of that name
    from the package index: every install command shown installs this one (by its
    own distribution name, from its clone, or its built wheel), with extras it has."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        extras = set(tomllib.load(file)["project"]["optional-dependencies"])
    commands = installs()
    assert len(commands) >= 6
    for where, target in commands:
        found = re.match(r"['\"]?([^'\"`\s,;)]+)", target)
        assert found is not None, f"{where}: pip install {target}"
        plain = found.group(1)
        path, _, wanted = plain.partition("[")
        # "../fastapi_jobs", "path/to/clone": installs from outside the clone.
        ours = path in (".", "./", "../fastapi_jobs", "path/to/clone", NAME) or re.fullmatch(
            r"\S*/fastapi_scheduled_jobs-\S+\.whl", path
        )
        # The tutorial's test tools: named for what they are, not for this project.
        tools = where == "tutorial.md" and path == "pytest"
        assert ours or tools, f"{where}: pip install {target} is not this project"
        for extra in filter(None, wanted.rstrip("]").split(",")):
            assert extra in extras, f"{where}: pip install {target}: no extra {extra!r}"


def test_the_status_example_has_every_field_the_api_answers() -> None:
    """The README's `GET /jobs` example shows each field of JobStatus and of its
    `cluster`, no more, no less (it once lacked four that had landed)."""
    example = json.loads(re.findall(r"```json\n(.*?)```", page("guides/jobs"), re.DOTALL)[0])
    for shown, model in ((example, JobStatus), (example["cluster"], ClusterJobStatus)):
        assert set(shown) == set(model.model_fields) | set(model.model_computed_fields)
    JobStatus.model_validate(example)  # and each value has the right shape


def test_the_schedules_guides_first_example_imports_both_schedule_classes() -> None:
    """A reader of the schedules guide writes `Every(...)` or `Cron(...)` after
    its first example (the table beneath names both): the example imports and
    uses both, so neither is a NameError."""
    first = next(code for path, code in COMPLETE if path.name == "schedules.md")
    tree = ast.parse(first)
    imported = {
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "fastapi_jobs"
        for alias in node.names
    }
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert {"Every", "Cron"} <= imported & called


def test_the_schedules_guide_says_an_applied_sets_names_are_tuples() -> None:
    """`AppliedSchedules.created`, `changed` and `removed` are tuples, which a
    list never equals: the guide and the class's docstring say so."""
    applied = AppliedSchedules("g", ("a",), (), (), 0)
    assert all(type(getattr(applied, f)) is tuple for f in ("created", "changed", "removed"))
    said = "`created`, `changed` and `removed` are\ntuples of names"
    assert said in page("guides/schedules")
    assert "``removed`` are tuples of names" in " ".join((AppliedSchedules.__doc__ or "").split())


def api_table() -> list[tuple[str, str]]:
    """The README's API table: (what is called, what it is), one pair a row."""
    table = (
        page("reference/api").partition("\n## At a glance\n")[2].strip("\n").partition("\n\n")[0]
    )
    rows = []
    for line in table.splitlines()[2:]:  # after the header
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows.append((cells[0], cells[1]))
    return rows


def _top_level(args: str) -> list[str]:
    """``a, b=(1, 2), c=[...]`` split at its top-level commas."""
    parts, depth, current = [], 0, ""
    for char in args:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()] if current.strip() else parts


def _callable(dotted: str) -> Callable[..., object]:
    """What a name in the API table calls: ``scheduler.x`` (and the bare methods
    written after it, ``pause``) are the Scheduler's, the rest by its full name."""
    import fastapi_jobs.metrics
    import fastapi_jobs.queues.arq
    import fastapi_jobs.queues.celery
    import fastapi_jobs.queues.procrastinate
    import fastapi_jobs.stores
    import fastapi_jobs.tracing

    known: dict[str, object] = {
        "scheduler": Scheduler,
        "Metrics": fastapi_jobs.metrics.Metrics,
        "fastapi_jobs": fastapi_jobs,
        **{name: getattr(fastapi_jobs, name) for name in fastapi_jobs.__all__},
    }
    first, *rest = dotted.split(".")
    found = known.get(first, Scheduler if not rest else None)
    assert found is not None, f"the API table names {dotted!r}, which is not known"
    for part in rest if first in known else [first]:
        found = getattr(found, part)
    assert callable(found)
    return found


def test_the_api_table_gives_each_call_its_real_parameters() -> None:
    """Each call in the API table's first column names only parameters the code
    has, with the code's defaults, and (unless it says `...`) all of them: the
    table once lacked `instrument(histograms_by_job=)`."""
    calls: dict[str, list[list[str]]] = {}
    for called, _ in api_table():
        for span in re.findall(r"`([^`]+)`", called):
            found = re.fullmatch(r"(?:await )?([\w.]+)\((.*)\)", span)
            if found is not None:
                calls.setdefault(found.group(1), []).append(_top_level(found.group(2)))
    assert {"Scheduler", "scheduler.every", "fastapi_jobs.metrics.instrument"} <= set(calls)
    for dotted, mentions in calls.items():
        function = _callable(dotted)
        signature = inspect.signature(function)
        params = {
            name: param
            for name, param in signature.parameters.items()
            if name != "self"
            and not (param.kind is param.POSITIONAL_ONLY and name[0] == "_")
            and param.kind is not param.VAR_KEYWORD
        }
        if any(
            "JobOptions" in str(p.annotation) and p.kind is p.VAR_KEYWORD
            for p in signature.parameters.values()
        ):
            params |= {  # **options: Unpack[JobOptions], with the defaults they get
                key: inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=value)
                for key, value in DEFAULTS.items()
            }
        if any(
            "ScheduleOptions" in str(p.annotation) and p.kind is p.VAR_KEYWORD
            for p in signature.parameters.values()
        ):
            params |= {  # **options: Unpack[ScheduleOptions]: a stored schedule's options
                key: inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY)
                for key in ScheduleOptions.__optional_keys__
            }
        named: set[str] = set()
        for args in mentions:
            for arg in args:
                if arg == "...":
                    continue
                name, equals, default = arg.partition("=")
                assert name in params, f"{dotted}(): no parameter {name!r} ({signature})"
                named.add(name)
                if equals and default and "..." not in default:
                    try:
                        value = ast.literal_eval(default)
                    except (ValueError, SyntaxError):
                        continue  # "30 days": words, not a literal
                    assert params[name].default == value, f"{dotted}({arg}): {signature}"
        if not any("..." in args for args in mentions):
            assert named == set(params), f"{dotted}(): the table lacks {set(params) - named}"


def test_the_api_table_names_every_public_name() -> None:
    """Every name the package and its public modules export is in the API table."""
    import fastapi_jobs.metrics
    import fastapi_jobs.observers
    import fastapi_jobs.stores
    import fastapi_jobs.testing
    import fastapi_jobs.tracing

    table = " ".join(f"{called} {what}" for called, what in api_table())
    spans = set(re.findall(r"[\w.]+", " ".join(re.findall(r"`([^`]+)`", table))))
    words = spans | {part for span in spans for part in span.split(".")}
    exported = [
        *fastapi_jobs.__all__,
        *fastapi_jobs.stores.__all__,
        *fastapi_jobs.observers.__all__,
        *fastapi_jobs.testing.__all__,
        *fastapi_jobs.metrics.__all__,
        *fastapi_jobs.tracing.__all__,
    ]
    assert [name for name in exported if name not in words] == []


def test_no_snippet_rebinds_the_metrics_module() -> None:
    """`metrics = instrument(...)` shadowed the module `fastapi_jobs.metrics`, and the
    text then called `metrics.router()`, which the module does not have: no block
    rebinds the name, and the README and the module's docstrings call a router
    only on what has one."""
    import fastapi_jobs.metrics

    for _, block in BLOCKS:
        assert not re.search(r"^\s*metrics\s*(?::[^=]*)?=[^=]", block, re.MULTILINE), block
    docs = "".join(TEXTS.values()) + (ROOT / "fastapi_jobs" / "metrics" / "__init__.py").read_text()
    if not hasattr(fastapi_jobs.metrics, "router"):
        assert re.findall(r"(?<![\w.])metrics\.router\(", docs) == []


CHILD_TASK_EXIT = """
import asyncio, sys
from fastapi_jobs import Every, Scheduler

async def child():
    sys.exit(3)

async def main():
    scheduler = Scheduler()

    async def job():
        if sys.argv[1] == "own":
            await child()
        else:
            await asyncio.gather(child())

    scheduler.add_job(job, Every(hours=1), name="job")
    async with scheduler.running():
        result = await scheduler.run_now("job")
    print(result.outcome, type(result.error).__name__)

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("where", "code", "said"), [("own", 0, "failed SystemExit"), ("task", 3, "")]
)
def test_sys_exit_is_a_failed_run_unless_raised_in_a_task_the_job_starts(
    where: str, code: int, said: str
) -> None:
    """As the Usage's Errors say: sys.exit() in the job's body is its failed run;
    in a task the job starts, asyncio raises it out of the event loop, which ends."""
    ran = subprocess.run(
        [sys.executable, "-c", CHILD_TASK_EXIT, where],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert (ran.returncode, ran.stdout.strip()) == (code, said), ran.stderr


def _anchors(text: str) -> set[str]:
    """The anchors of a page's headings, as Python-Markdown's toc makes them."""
    found = set()
    for heading in re.findall(
        r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M
    ):
        slug = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        found.add(re.sub(r"[-\s]+", "-", slug))
    return found


def test_the_readme_is_what_a_newcomer_reads_first_and_its_links_work() -> None:
    """At most 150 lines, and each relative link names a file of the repository
    (and a heading of it): the README is read on the forge, outside the docs
    site, where mkdocs --strict does not check it."""
    assert len(README.splitlines()) <= 150
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if not re.match(r"https?://", link)]
    assert len(local) >= 10
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), link
        if anchor:
            assert anchor in _anchors(target.read_text()), link


def test_the_docs_wheel_command_names_this_version() -> None:
    """The install page's wheel is the one `python -m build` makes of this version."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wheels = re.findall(r"fastapi_scheduled_jobs-([^-]+)-py3-none-any\.whl", page("index"))
    assert wheels and set(wheels) == {project["version"]}


def test_the_pages_fastapi_jobs_next_commands_run_as_written() -> None:
    """The schedule-checking commands shown need no app: each runs as written (by
    the installed console script) and prints the run times it promises."""
    import shlex

    commands = [
        line.split("#")[0].strip()
        for _, code in blocks("bash")
        for line in code.splitlines()
        if line.startswith("fastapi-jobs next ")
    ]
    assert commands
    script = Path(sys.executable).parent / "fastapi-jobs"
    for command in commands:
        args = shlex.split(command)[1:]
        ran = subprocess.run([script, *args], capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, (command, ran.stderr)
        count = int(args[args.index("-n") + 1]) if "-n" in args else 5
        assert len(ran.stdout.strip().splitlines()) >= count, ran.stdout
