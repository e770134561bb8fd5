"""Every secret on every output. The words the HTTP reference lists as secrets'
names (the code's list is held equal to it) are each put in a schedule's
kwargs flat, nested in objects, in lists, in another case, and holding an
object; no place those kwargs can reach shows a value under one: the HTTP
answers and errors, the status page, the command line, the log at every
level, the reprs and ``to_dict`` of the public types, errors that quote what
they were given, the metrics, the spans and the hooks' events. One app on one
SQLite file, every place read, then every secret looked for in each. And
the masking of nested kwargs, on its own."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from fastapi_jobs import (
    ConfigurationError,
    ErrorInfo,
    Every,
    NameTakenError,
    Scheduler,
    ScheduleSpec,
    StoredSchedule,
)
from fastapi_jobs._cli.main import main
from fastapi_jobs._redaction import SECRET_NAMES
from fastapi_jobs.metrics import instrument as instrument_metrics
from fastapi_jobs.observers import LeaseLost, Observer, RunFinished, RunStarted, TickSkipped
from fastapi_jobs.queues import HandoffRequest
from fastapi_jobs.tracing import instrument as instrument_tracing

from ..apps import secrets_app
from ..conftest import serve
from ..support.cluster import ROOT

HTTP_REFERENCE = ROOT / "docs" / "reference" / "http.md"
VISIBLE = "acme-visible"
"""A kwarg that is no secret: the places that show kwargs show it."""
URL_SECRET = "hunterurl"
HIDDEN = "[hidden]"


def documented_names() -> list[str]:
    """The words the HTTP reference lists as those of secrets' names."""
    text = HTTP_REFERENCE.read_text(encoding="utf-8")
    _, found, rest = text.partition("name holds one of these words, in any case:\n")
    assert found, "the HTTP reference lost its list of secrets' names"
    return re.findall(r"`([^`]+)`", rest.split("\n\n", 1)[0])


NAMES = documented_names()


def secret(i: int, where: str) -> str:
    return f"hunter{i:02}{where}"


def secret_kwargs() -> dict[str, Any]:
    """Every documented name: as written, in an object of an object (upper
    case), in a list (title case), and holding an object; a URL's password."""
    kwargs: dict[str, Any] = {
        "tenant": VISIBLE,
        "source_url": f"postgresql://app:{URL_SECRET}@db/app",
    }
    for i, name in enumerate(NAMES):
        kwargs[name] = secret(i, "flat")
        kwargs[f"nested{i}"] = {"db": {f"Db_{name.upper()}": secret(i, "nested")}}
        kwargs[f"listed{i}"] = [{"n": 1}, {f"{name.title()}2": secret(i, "listed")}]
        kwargs[f"my{name}"] = {"inner": [secret(i, "whole")]}
    return kwargs


SECRETS = [
    URL_SECRET,
    *(secret(i, where) for i in range(len(NAMES)) for where in ("flat", "nested", "listed")),
    *(secret(i, "whole") for i in range(len(NAMES))),
]


def test_the_code_hides_the_words_the_http_reference_lists() -> None:
    """The list on the page is the list in the code, word for word."""
    assert list(SECRET_NAMES) == NAMES


class Events(Observer):
    """Every hook's event, as an observer that logs them would show them."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def run_started(self, event: RunStarted) -> None:
        self.seen.append(repr(event))

    def run_finished(self, event: RunFinished) -> None:
        self.seen.append(repr(event))

    def tick_skipped(self, event: TickSkipped) -> None:
        self.seen.append(repr(event))

    def lease_lost(self, event: LeaseLost) -> None:
        self.seen.append(repr(event))


def one_each(make: Any) -> str:
    """What ``make(small)`` raises, for each name alone in a small object (an
    error cuts what it quotes short: a secret must be in its first characters)."""
    said = []
    for i, name in enumerate(NAMES):
        try:
            make({name: secret(i, "flat")})
        except (ConfigurationError, TypeError) as exc:
            said.append(str(exc))
        else:
            raise AssertionError(f"{make} took {name}")
    return "\n".join(said)


async def app_outputs(url: str, kwargs: dict[str, Any]) -> tuple[dict[str, str], list[Any]]:
    """Each place of a run of the app (make, fail, change, apply, run, remove a
    schedule holding ``kwargs``) with what it showed; the kwargs the task got."""
    scheduler, app, queue, got = secrets_app.make(url, kwargs)
    events = Events()
    scheduler.add_observer(events)
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    instrument_tracing(
        scheduler, tracer_provider=tracer_provider, meter_provider=MeterProvider([reader])
    )
    app.include_router(instrument_metrics(scheduler, CollectorRegistry()).router())
    seen: dict[str, str] = {}
    body = {"name": "s", "task": "sync", "schedule": {"every": 3600}, "kwargs": kwargs}
    async with serve(app) as client:

        async def ask(place: str, method: str, path: str, status: int, sent: Any = None) -> None:
            answer = await client.request(method, path, json=sent)
            assert answer.status_code == status, (place, answer.text)
            seen[f"{method} {path}: {place}"] = f"{answer.headers}\n{answer.text}"

        await ask("made", "POST", "/jobs/schedules", 201, body)
        await ask("taken", "POST", "/jobs/schedules", 409, body)
        await ask("no object", "POST", "/jobs/schedules", 422, {**body, "kwargs": [kwargs]})
        await ask("too often", "POST", "/jobs/schedules", 422, {**body, "schedule": {"every": 1}})
        await ask("changed", "PATCH", "/jobs/schedules/s", 200, {"kwargs": {**kwargs, "round": 2}})
        await ask("unknown", "PATCH", "/jobs/schedules/nope", 404, {"kwargs": kwargs})
        group = {"schedules": [{**body, "name": "g1"}]}
        await ask("applied", "PUT", "/jobs/schedules?group=g", 200, group)
        await ask("another's", "PUT", "/jobs/schedules?group=h", 409, group)
        await ask("failed", "POST", "/jobs/s/run?wait=true", 200)  # as the task does
        await ask("paused", "POST", "/jobs/s/pause", 200)
        await ask("resumed", "POST", "/jobs/s/resume", 200)
        since = {"since": "2026-01-01T00:00:00Z", "until": "2026-01-01T01:00:00Z"}
        await ask("backfill", "POST", "/jobs/s/backfill", 202, since)
        for path in (
            "/jobs",
            "/jobs/s",
            "/jobs/s/runs",
            "/jobs/schedules",
            "/jobs/schedules?state=failing",
            "/jobs/ui",
            "/jobs/ui?state=failing",
            "/metrics",
            "/healthz/jobs",
        ):
            await ask("read", "GET", path, 200)
        await python_outputs(scheduler, body, seen)
        queue.returns = [kwargs]
        seen["a hand-off's error"] = repr(await scheduler.run_now("bad_handoff"))
        seen["a hand-off's error, one each"] = "\n".join(
            [repr(await run_refused(scheduler, queue, small)) for small in one_small_each()]
        )
        seen["HandoffRequest"] = "\n".join(queue.given)
        seen["the runs"] = repr([await scheduler.runs(job) for job in scheduler.jobs])
        await ask("removed", "DELETE", "/jobs/schedules/s", 204)
        await ask("unknown", "DELETE", "/jobs/schedules/s", 404)
        await ask("after", "GET", "/jobs/schedules", 200)
    seen["the hooks' events"] = "\n".join(events.seen)
    seen["the spans"] = "\n".join(span.to_json() for span in spans.get_finished_spans())
    skips = reader.get_metrics_data()  # None: no tick was skipped
    seen["the OpenTelemetry metrics"] = "" if skips is None else skips.to_json()
    return seen, got


def one_small_each() -> list[list[dict[str, str]]]:
    return [[{name: secret(i, "flat")}] for i, name in enumerate(NAMES)]


async def run_refused(scheduler: Scheduler, queue: secrets_app.Queue, returns: object) -> Any:
    queue.returns = returns
    return await scheduler.run_now("bad_handoff")


async def python_outputs(scheduler: Scheduler, body: dict[str, Any], seen: dict[str, str]) -> None:
    """The public types' reprs and JSON, and the errors that quote what they were given."""
    listed = await scheduler.schedules()
    assert [s.name for s in listed] == ["g1", "s"]
    seen["repr(StoredSchedule)"] = repr(listed)
    seen["StoredSchedule.to_dict()"] = json.dumps([s.to_dict() for s in listed])
    seen["repr(Job)"] = repr(scheduler.jobs["s"])
    kwargs = body["kwargs"]
    seen["repr(ScheduleSpec)"] = repr(ScheduleSpec("p", "sync", Every(hours=1), kwargs=kwargs))
    seen["repr(ScheduleSpec.from_dict())"] = repr(ScheduleSpec.from_dict(body))
    seen["repr(HandoffRequest)"] = repr(
        HandoffRequest("j", listed[0].updated_at, "k", kwargs, {})  # type: ignore[arg-type]
    )
    seen["repr(RunResult) of a failed run"] = repr(await scheduler.run_now("s"))
    triggered = await scheduler.trigger("s")
    seen["repr(TriggeredRun)"] = f"{triggered!r} {await triggered.wait()!r}"
    seen["repr(RunResult) of a hand-off"] = repr(await scheduler.run_now("handoff"))
    seen["the status"] = json.dumps([s.model_dump(mode="json") for s in scheduler.status()])
    with pytest.raises(NameTakenError) as taken:
        await scheduler.add_schedule("s", "sync", Every(hours=1), kwargs=kwargs)
    seen["add_schedule(a taken name)"] = str(taken.value)
    seen["from_dict(not an object)"] = one_each(lambda small: ScheduleSpec.from_dict([small]))
    said = []
    for small in one_small_each():
        for wanted in (small, small[0], ScheduleSpec("p", "sync", Every(hours=1), small[0])):
            with pytest.raises(ConfigurationError) as refused:
                await scheduler.apply_schedules("g", wanted)  # type: ignore[arg-type]
            said.append(str(refused.value))
    seen["apply_schedules(not ScheduleSpecs)"] = "\n".join(said)
    seen["a run's error as shown (ErrorInfo)"] = "\n".join(
        ErrorInfo.of(RuntimeError(f"login with {name}={secret(i, 'flat')} refused")).message
        for i, name in enumerate(NAMES)
    )


def cli_outputs(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Each command's output (stdout and stderr), the app's own opened by the
    command as ``fastapi-jobs`` does, on a store it fills itself."""
    kwargs = secret_kwargs()
    _, app, _, _ = secrets_app.make(url, kwargs)
    monkeypatch.setattr(secrets_app, "app", app)
    target = "tests.apps.secrets_app:app"
    given = json.dumps(kwargs)
    sets = Path(url.removeprefix("sqlite+aiosqlite:///")).parent
    made = {"name": "c2", "task": "sync", "schedule": {"every": 3600}, "kwargs": kwargs}
    (sets / "set.json").write_text(json.dumps({"schedules": [made]}))
    (sets / "bad.json").write_text(json.dumps({"schedules": one_small_each()[0]}))
    add = ["schedule", "add", target, "c1", "sync", "--every", "3600", "--kwargs", given]
    apply = ["schedule", "apply", target, "--group", "cli"]
    commands: dict[str, tuple[list[str], int]] = {
        "schedule add": (add, 0),
        "schedule add (a taken name)": (add, 2),
        "schedule change": (["schedule", "change", target, "c1", "--kwargs", given], 0),
        "schedule apply": ([*apply, str(sets / "set.json")], 0),
        "schedule apply (not a schedule)": ([*apply, str(sets / "bad.json")], 2),
        "schedules": (["schedules", target], 0),
    }
    seen = {}
    for place, (argv, code) in commands.items():
        exit_code = main(argv)
        out, err = capsys.readouterr()
        assert exit_code == code, (place, out, err)
        seen[f"fastapi-jobs {place}"] = f"{out}\n{err}"
    return seen


DRIVERS = ("aiosqlite", "sqlalchemy")
"""The loggers whose DEBUG lines carry every statement's parameters, whatever
the app stores (the observing guide says so): not ours to hide."""


def capture_every_level(caplog: pytest.LogCaptureFixture) -> None:
    for driver in DRIVERS:  # thousands of lines, not ours
        caplog.set_level(logging.WARNING, logger=driver)
    caplog.set_level(logging.DEBUG, logger="fastapi_jobs")
    caplog.set_level(logging.DEBUG)  # last: each call sets the capture's own level too


def leaked(seen: dict[str, str], caplog: pytest.LogCaptureFixture) -> dict[str, list[str]]:
    """The places (and each log record) that show a secret, with the secrets shown."""
    lines = logging.Formatter("%(name)s %(levelname)s %(message)s")
    assert any(record.levelno == logging.DEBUG for record in caplog.records)
    for n, record in enumerate(caplog.records):
        if record.name.partition(".")[0] not in DRIVERS:
            # As a line, and as a JSON formatter would show it (its extras too).
            place = f"log record {n}: {record.name} {record.levelname}"
            seen[place] = f"{lines.format(record)}\n{vars(record)!r}"
    found = {place: [s for s in SECRETS if s in text] for place, text in seen.items()}
    return {place: shown for place, shown in found.items() if shown}


SHOWN = (
    "POST /jobs/schedules: made",
    "PATCH /jobs/schedules/s: changed",
    "GET /jobs/schedules: read",
    "GET /jobs/schedules: after",
    "repr(StoredSchedule)",
    "StoredSchedule.to_dict()",
    "repr(Job)",
    "repr(ScheduleSpec)",
    "repr(ScheduleSpec.from_dict())",
    "repr(HandoffRequest)",
    "HandoffRequest",
)
"""The places that show kwargs: each shows ``VISIBLE`` (none is clean for
showing nothing)."""


async def test_no_secret_shows_on_any_output(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No value under a documented secret's name, nor a URL's password, shows on
    any output of an app that makes, fails, changes, applies, runs and removes
    schedules holding them; the task gets them as given."""
    capture_every_level(caplog)
    kwargs = secret_kwargs()
    seen, got = await app_outputs(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}", kwargs)
    assert leaked(seen, caplog) == {}
    assert [place for place in SHOWN if VISIBLE not in seen[place]] == []
    assert HIDDEN in seen["GET /jobs/schedules: read"]
    assert got and all(given in (kwargs, {**kwargs, "round": 2}) for given in got)


def test_no_secret_shows_on_the_command_line(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nor on what the commands print (the schedule made, changed, listed; a
    set applied; their errors) and log, in a process as ``fastapi-jobs`` runs."""
    capture_every_level(caplog)
    seen = cli_outputs(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}", capsys, monkeypatch)
    assert leaked(seen, caplog) == {}
    shown = ("schedule add", "schedule change", "schedules")
    assert [p for p in shown if VISIBLE not in seen[f"fastapi-jobs {p}"]] == []
    assert HIDDEN in seen["fastapi-jobs schedules"]


# -- nested kwargs, on their own ----------------------------------------------


def shown(kwargs: Any) -> Any:
    """``kwargs`` as a listing shows them (`StoredSchedule.to_dict`)."""
    return StoredSchedule("s", "sync", Every(hours=1), kwargs=kwargs).to_dict()["kwargs"]


def test_names_are_looked_at_in_objects_in_lists_in_objects() -> None:
    """A secret's name is found at any depth, through lists and objects, and
    only its value is hidden; so are a URL's credentials, whatever its name."""
    kwargs = {
        "jobs": [{"source": {"user": "ana", "password": "x"}}, {"targets": [{"token": "y"}]}],
        "matrix": [[{"api_key": "z", "region": "eu"}]],
        "mirrors": [{"at": "https://ana:w@mirror.example/x"}],
        "tenant": "acme",
    }
    assert shown(kwargs) == {
        "jobs": [
            {"source": {"user": "ana", "password": HIDDEN}},
            {"targets": [{"token": HIDDEN}]},
        ],
        "matrix": [[{"api_key": HIDDEN, "region": "eu"}]],
        "mirrors": [{"at": "https://[hidden]@mirror.example/x"}],
        "tenant": "acme",
    }


def test_a_deep_secret_is_hidden_as_deep_as_kwargs_may_nest() -> None:
    """At the deepest nesting a schedule's kwargs may have (32 levels)."""
    kwargs: Any = {"dsn": "x"}
    for level in range(31):  # 31 levels more, lists and objects in turn, an object on top
        kwargs = [kwargs] if level % 2 else {"up": kwargs}
    assert "'x'" not in repr(shown(kwargs)) and HIDDEN in repr(shown(kwargs))


@pytest.mark.parametrize(
    "name",
    [
        "PASSWORD",
        "Password",
        "pAsSwOrD",
        "db_Password_2",
        "API-KEY",
        "apiKey",
        "ApiKey",
        "Private-Key",
        "privatekey",
        "X-Auth-Token",
        "DB_DSN",
        "Webhook_URL",
        "clientSecret",
    ],
)
def test_a_secrets_name_is_one_in_any_case_and_with_any_separator(name: str) -> None:
    assert shown({"nested": [{name: "x"}]}) == {"nested": [{name: HIDDEN}]}


def test_other_names_keep_their_values() -> None:
    """Names that hold no secret's word are shown as given."""
    kwargs = {"user": "ana", "url": "https://example.com", "apis": ["a"], "keyboard": "fr"}
    assert shown(kwargs) == kwargs


def test_a_secrets_name_hides_its_value_whole() -> None:
    """An object, a list, a number or null under a secret's name is hidden
    whole: nothing of it shows, not even its names."""
    kwargs = {
        "credentials": {"user": "ana", "region": "eu"},
        "tokens": ["a", {"b": 1}],
        "session": None,
        "pin_pwd": 1234,
    }
    assert shown(kwargs) == dict.fromkeys(kwargs, HIDDEN)


def test_a_repr_hides_them_in_tuples_and_survives_a_cycle() -> None:
    """A `ScheduleSpec` holds kwargs as given, before any check: a secret in a
    tuple is hidden in its repr, and kwargs that hold themselves are hidden
    whole rather than failing the repr."""
    kwargs = {"hooks": ({"token": "t"},), 1: "x"}
    spec = ScheduleSpec("s", "sync", Every(hours=1), kwargs=kwargs)  # type: ignore[arg-type]
    assert "kwargs={'hooks': ({'token': '[hidden]'},), 1: 'x'}" in repr(spec)
    cycle: dict[str, Any] = {"tenant": "acme"}
    cycle["self"] = cycle
    assert "kwargs='[hidden]'" in repr(ScheduleSpec("s", "sync", Every(hours=1), kwargs=cycle))


ERROR_FORMS = [
    ("login failed: password=hunter2", "login failed: password=[hidden]"),
    ("error: token=abc123", "error: token=[hidden]"),
    ("Authorization: Bearer abc123", "Authorization: [hidden]"),
    (
        "GET https://api.test/x?api_key=abc123 failed",
        "GET https://api.test/x?api_key=[hidden] failed",
    ),
    ("password='correct horse battery'", "password='[hidden]'"),
    ("secret: [abc123, def456]", "secret: [hidden]"),
    ("redis://:p@ss@cache:6379", "redis://[hidden]@cache:6379"),
    ('{"api_key": "abc", "n": 1}', '{"api_key": "[hidden]", "n": 1}'),
    ("host=db password=s3cret dbname=app", "host=db password=[hidden] dbname=app"),
    ("no secret here: n=1", "no secret here: n=1"),
]


@pytest.mark.parametrize(("said", "shown"), ERROR_FORMS, ids=[s for s, _ in ERROR_FORMS])
def test_a_secret_in_an_errors_text_is_hidden_in_each_form_it_takes(said: str, shown: str) -> None:
    """A secret's setting in a job's error is hidden whatever words come before
    it, quoted, in a list, in a URL's query, after an auth scheme, or in the
    credentials of a URL with an @ in its password."""
    from fastapi_jobs import ErrorInfo

    assert ErrorInfo.of(RuntimeError(said)).message == shown


def test_a_secret_in_a_kwargs_text_is_hidden_whatever_its_name() -> None:
    """A value that holds a DSN's password or a URL's token is hidden in it, as
    an error's text is, under a name that is no secret's."""
    from fastapi_jobs._redaction import shown

    kwargs = {"conninfo": "host=db password=hunter2", "url": "https://x.test/?token=abc"}
    assert shown(kwargs) == {
        "conninfo": "host=db password=[hidden]",
        "url": "https://x.test/?token=[hidden]",
    }


def test_a_long_error_is_read_only_as_far_as_it_is_shown() -> None:
    """Only the start of a megabyte's first line is read; a URL cut in its
    credentials there is hidden to the end."""
    from fastapi_jobs import ErrorInfo

    said = ErrorInfo.of(RuntimeError("x" * 4090 + " https://user:" + "p" * 1_000_000)).message
    assert "ppp" not in said and len(said) == 300
    assert ErrorInfo.of(RuntimeError("redis://user:" + "p" * 1_000_000)).message.startswith(
        "redis://[hidden]"
    )
