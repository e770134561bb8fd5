"""SQLAlchemy installed but a driver or greenlet missing: the store says which
extra to install when it is made (or, for greenlet under SQLAlchemy 2.1, when
it is imported), never a bare ModuleNotFoundError at the app's startup."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs import ConfigurationError
from fastapi_jobs.stores import SQLAlchemyStore

SQLITE = "sqlite+aiosqlite:///jobs.sqlite3"


def hint(extra: str) -> str:
    return f"pip install 'fastapi-scheduled-jobs[{extra}]'"


@pytest.mark.parametrize(
    ("url", "driver", "extra"),
    [
        (SQLITE, "aiosqlite", "sqlite"),
        ("postgresql+asyncpg://app:s3cret@db/app", "asyncpg", "postgres"),
        ("postgresql+psycopg://app:s3cret@db/app", "psycopg", "psycopg"),
        ("postgresql+psycopg_async://app:s3cret@db/app", "psycopg", "psycopg"),
    ],
    # No server's name in the ids: no server is reached (test_markers tells a test
    # that needs PostgreSQL by its id).
    ids=["without=aiosqlite", "without=asyncpg", "without=psycopg", "without=psycopg_async"],
)
def test_a_missing_driver_is_named_when_the_store_is_made(
    url: str, driver: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its driver not importable, SQLAlchemyStore(url) raises at once, naming
    the driver and the extra that installs it (the URL's password masked)."""
    monkeypatch.setitem(sys.modules, driver, None)  # importing it fails, as if not installed
    with pytest.raises(ConfigurationError) as raised:
        SQLAlchemyStore(url)
    said = str(raised.value)
    assert f"needs the driver {driver}, which cannot be imported" in said
    assert hint(extra) in said and f"pip install '.[{extra}]'" in said
    assert "s3cret" not in said
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)


def test_a_missing_greenlet_is_named_when_the_store_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SQLAlchemy imported but greenlet not importable (SQLAlchemy 2.0 imports
    its asyncio without it): the store, made from a URL, an engine or a
    callable, names the extra of its database, or all three when it cannot
    know which."""
    engine = create_async_engine("postgresql+asyncpg://app@db/app")
    monkeypatch.setitem(sys.modules, "greenlet", None)
    for source, extras in (
        (SQLITE, ["sqlite"]),
        (engine, ["postgres"]),
        (lambda state: state["db"], ["sqlite", "postgres", "psycopg"]),
    ):
        with pytest.raises(ConfigurationError) as raised:
            SQLAlchemyStore(source)
        said = str(raised.value)
        assert "needs greenlet (SQLAlchemy's asyncio), which cannot be imported" in said
        assert "the extra " + " or ".join(f"[{extra}]" for extra in extras) in said
        assert hint(extras[0]) in said


def test_without_greenlet_the_extra_is_named_before_the_app_starts() -> None:
    """In a process without greenlet from its start, importing or making the
    store says which extras bring it (SQLAlchemy 2.1 refuses to import its
    asyncio without greenlet: the import says it; 2.0's imports: the store)."""
    code = (
        "import sys; sys.modules['greenlet'] = None\n"
        "try:\n"
        "    from fastapi_jobs.stores import SQLAlchemyStore\n"
        f"    SQLAlchemyStore({SQLITE!r})\n"
        "except (ImportError, ValueError) as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    kind, _, said = out.stdout.partition(" ")
    assert kind in ("ModuleNotFoundError", "ConfigurationError"), out.stdout
    assert "needs greenlet (SQLAlchemy's asyncio)" in said
    assert "[sqlite]" in said and hint("sqlite") in said
