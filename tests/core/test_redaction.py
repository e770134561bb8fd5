"""What of a job's error and of a schedule's kwargs is shown: each case below
was a mutant of ``_redaction`` that no other test on SQLite told apart
(docs/development/mutation.md)."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import asyncpg  # type: ignore[import-untyped]  # no type hints of its own
import pytest
import sqlalchemy as sa

from fastapi_jobs import ErrorInfo, Every, ScheduleSpec


def _check_failed() -> sqlite3.IntegrityError:
    # Closed: Python 3.13 warns of a connection left to the collector, and the
    # next module's first test (whose setup collects) fails with it.
    with closing(sqlite3.connect(":memory:")) as connection:
        connection.execute("CREATE TABLE t (x TEXT CHECK (x != 'hunter2'))")
        with pytest.raises(sqlite3.IntegrityError) as raised:
            connection.execute("INSERT INTO t VALUES ('hunter2')")
    return raised.value


def test_a_database_errors_quoted_value_is_hidden() -> None:
    """SQLite's CHECK error quotes the refused value: shown, the quotes are kept
    and what they hold is not, as for PostgreSQL's errors."""
    info = ErrorInfo.of(_check_failed())
    assert (info.type, info.message) == ("IntegrityError", "CHECK constraint failed: x != '…'")


def test_sqlalchemys_wrapping_of_a_database_error_is_cut_off() -> None:
    """SQLAlchemy's wrapping adds the driver's class before the message and the
    statement and its parameters after it: the message alone is shown."""
    engine = sa.create_engine("sqlite://")
    with engine.connect() as connection:
        connection.execute(sa.text("CREATE TABLE t (x TEXT CHECK (x != 'hunter2'))"))
        with pytest.raises(sa.exc.IntegrityError) as raised:
            connection.execute(sa.text("INSERT INTO t VALUES (:x)"), {"x": "hunter2"})
    engine.dispose()
    assert str(raised.value).startswith("(sqlite3.IntegrityError) CHECK")
    assert ErrorInfo.of(raised.value).message == "CHECK constraint failed: x != '…'"


def test_asyncpgs_refused_argument_is_hidden() -> None:
    """asyncpg repeats the argument it refused, unquoted: the value is cut from
    its message, what follows it kept."""
    error = asyncpg.exceptions.DataError(
        "invalid input for query argument $1: 'hunter2' (expected str, got int)"
    )
    assert ErrorInfo.of(error).message == (
        "invalid input for query argument $1: … (expected str, got int)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("first\nsecond", "first"),
        ("a\x1bb\tc", "a b c"),
        ("x" * 300, "x" * 300),
        ("x" * 301, "x" * 299 + "…"),
    ],
)
def test_an_errors_first_line_is_shown_printable_and_cut_with_an_ellipsis(
    text: str, message: str
) -> None:
    """Only the first line is shown, a character that does not print as a
    space; a message of 300 characters whole, a longer one cut with an ellipsis."""
    assert ErrorInfo.of(ValueError(text)).message == message


def test_only_a_secret_settings_value_is_hidden_in_an_error() -> None:
    """In an error's message, the value of a setting named like a secret is
    hidden; a setting under any other name is shown whole."""
    error = ConnectionError("retries=3, api_key=sk_live_1 host: db.internal")
    assert ErrorInfo.of(error).message == "retries=3, api_key=[hidden] host: db.internal"


def test_an_error_without_a_message_is_its_type_alone() -> None:
    """An error with no message is kept as its type's name, and read back so."""
    info = ErrorInfo.of(RuntimeError())
    assert (str(info), ErrorInfo.parse(str(info))) == ("RuntimeError", info)


def test_a_repr_with_its_kwargs_hidden_reads_as_the_dataclasss_own() -> None:
    """A schedule's repr, its secret-like kwargs hidden, is written as the
    dataclass would write it."""
    spec = ScheduleSpec("p", "sync", Every(hours=1), kwargs={"token": "t", "n": 1})
    assert repr(spec) == (
        "ScheduleSpec(name='p', task='sync', schedule=Every(seconds=3600.0, offset=0.0), "
        "kwargs={'token': '[hidden]', 'n': 1}, options=None)"
    )
