"""The store's tables made by the app's migrations: ``include_tables`` with real
Alembic (the env.py of docs/guides/migrations.md), and ``create_tables=False``, which
never creates nor alters anything."""

from __future__ import annotations

import asyncio
import io
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fastapi_jobs import ConfigurationError, ErrorInfo, JobContext, Scheduler, StoreError
from fastapi_jobs.stores import SQLAlchemyStore, include_tables

from ..conftest import claim1, open_store, release1

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "guides" / "migrations.md").read_text()
FRAGMENTS: dict[str, str] = {
    code.splitlines()[0]: code
    for code in re.findall(r"^```python\n(.*?)^```", PAGE, re.DOTALL | re.MULTILINE)
}


def ddl_sent(on_statement: Callable[[Callable[..., None]], None], kinds: str) -> list[str]:
    """The statements of these kinds (``CREATE|ALTER``) any engine sends from now on."""
    sent: list[str] = []
    pattern = re.compile(rf"\s*({kinds})\b", re.IGNORECASE)

    def seen(conn: object, cursor: object, statement: str, *rest: object) -> None:
        if pattern.match(statement):
            sent.append(statement)

    on_statement(seen)
    return sent


def fragment(starting: str) -> str:
    """The page's block whose first line starts with ``# fragment: <starting>``."""
    [code] = [
        code for first, code in FRAGMENTS.items() if first.startswith(f"# fragment: {starting}")
    ]
    return code


STORE_TABLES = [
    f"fastapi_jobs_{kind}"
    for kind in ("claims", "handoffs", "instances", "instants", "pauses", "runs", "schedules")
]
# The app of the page's env.py (`from myapp.models import Base`): its own table and
# index, and the naming convention Alembic's documentation recommends.
MODELS = """
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    metadata = sa.MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Note(Base):
    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str] = mapped_column(sa.String(100), index=True)
"""


@pytest.fixture
def alembic_config(tmp_path: Path, database_url: str) -> Iterator[Config]:
    """An Alembic project in ``tmp_path`` whose env.py is the page's, on a fresh
    database, with the app package it imports; the app's modules are forgotten
    after the test (each test imports its own Base)."""
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text(MODELS)
    scripts = tmp_path / "migrations"
    (scripts / "versions").mkdir(parents=True)
    (scripts / "env.py").write_text(fragment("migrations/env.py"))
    template = Path(command.__file__).parent / "templates" / "async" / "script.py.mako"
    (scripts / "script.py.mako").write_text(template.read_text())
    config = Config(stdout=io.StringIO())
    config.set_main_option("script_location", str(scripts))
    config.set_main_option("sqlalchemy.url", database_url)
    sys.path.insert(0, str(tmp_path))
    try:
        yield config
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.split(".")[0] == "myapp"]:
            del sys.modules[name]


def models() -> Any:
    import myapp.models  # type: ignore[import-not-found]

    return myapp.models


async def alembic(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """An Alembic command, in a thread: the page's env.py runs its own event loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def upgrade_ops(script: Any) -> str:
    """The body of a generated revision's ``upgrade()``."""
    text = Path(script.path).read_text()
    return text.split("def upgrade()", 1)[1].split("def downgrade()", 1)[0]


async def differences(engine: AsyncEngine, metadata: sa.MetaData) -> list[Any]:
    """What autogenerate finds between ``metadata`` and the database, comparing
    types and server defaults too."""
    opts = {"compare_type": True, "compare_server_default": True}

    def compare(conn: sa.Connection) -> list[Any]:
        return list(compare_metadata(MigrationContext.configure(conn, opts=opts), metadata))

    async with engine.connect() as conn:
        return await conn.run_sync(compare)


async def test_alembic_makes_the_tables_and_the_store_claims_on_them(
    alembic_config: Config,
    database_url: str,
    on_statement: Callable[[Callable[..., None]], None],
) -> None:
    """Autogenerate with the page's env.py sees the store's tables and the
    app's own; upgrade makes them; a second autogenerate finds nothing to change
    (types, index, server default compared); then a store with
    create_tables=False claims and runs a job on them, sending no DDL."""
    first = await alembic(command.revision, alembic_config, "tables", autogenerate=True)
    ops = upgrade_ops(first)
    assert sorted(re.findall(r"op\.create_table\('(\w+)'", ops)) == [*STORE_TABLES, "notes"]
    assert sorted(re.findall(r"op\.create_index\(op\.f\('(\w+)'\)", ops)) == [
        "ix_fastapi_jobs_runs_job",
        "ix_fastapi_jobs_sch_grp",
        "ix_fastapi_jobs_sch_ver",
        "ix_notes_text",
    ]
    assert "info=" not in ops  # nothing of the store's own bookkeeping in the app's migration
    await alembic(command.upgrade, alembic_config, "head")
    second = await alembic(command.revision, alembic_config, "nothing", autogenerate=True)
    assert "op." not in upgrade_ops(second)
    engine = create_async_engine(database_url)
    try:
        assert await differences(engine, models().Base.metadata) == []

        ddl = ddl_sent(on_statement, "CREATE|ALTER|DROP")
        namespace: dict[str, Any] = {"SQLAlchemyStore": SQLAlchemyStore}
        exec(fragment("the store of an app whose migrations"), namespace)
        scheduler = Scheduler(store=namespace["store"])
        fences: list[int | None] = []

        @scheduler.every(hours=1)
        async def digest(ctx: JobContext) -> None:
            fences.append(ctx.fence)

        async with scheduler.running({"db": engine}):
            run = await scheduler.trigger("digest", wait=True)
            result = await run.wait()
            history = await scheduler.runs("digest")
        assert result is not None and result.ok
        assert fences == [1]
        assert [(r.outcome, r.manual) for r in history] == [("ok", True)]
        assert ddl == []
    finally:
        await engine.dispose()


async def test_the_upgrade_as_sql_creates_the_store_tables(alembic_config: Config) -> None:
    """`alembic upgrade head --sql` (the page's offline branch) writes the store's
    CREATE TABLEs with the app's, for someone else to run."""
    await alembic(command.revision, alembic_config, "tables", autogenerate=True)
    out = io.StringIO()
    offline = Config(output_buffer=out)
    for option in ("script_location", "sqlalchemy.url"):
        offline.set_main_option(option, alembic_config.get_main_option(option) or "")
    await alembic(command.upgrade, offline, "head", sql=True)
    made = re.findall(r"CREATE TABLE (\w+)", out.getvalue())
    assert sorted(made) == sorted(["alembic_version", *STORE_TABLES, "notes"])


async def test_tables_the_store_made_need_no_migration(database_url: str) -> None:
    """An app that ran with create_tables=True and moves to Alembic: autogenerate
    proposes only the app's own tables, none of the store's (same columns, types,
    defaults, index name under the app's naming convention)."""
    engine = create_async_engine(database_url)
    try:
        async with open_store(engine) as store:
            assert await claim1(store, "digest", 1.0) == 1
        metadata = sa.MetaData(
            naming_convention={"ix": "ix_%(column_0_label)s", "pk": "pk_%(table_name)s"}
        )
        sa.Table("notes", metadata, sa.Column("id", sa.Integer, primary_key=True))
        include_tables(metadata)
        found = await differences(engine, metadata)
        assert [(kind, getattr(item, "name", None)) for kind, item, *_ in found] == [
            ("add_table", "notes")
        ]
    finally:
        await engine.dispose()


def test_the_store_index_keeps_its_name_under_any_naming_convention() -> None:
    """A convention that would rename a named index (its %(constraint_name)s)
    leaves the store's alone: the name the store makes for itself, and that
    autogenerate compares; the primary keys take the app's convention."""
    metadata = sa.MetaData(
        naming_convention={
            "ix": "idx_%(table_name)s_%(constraint_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    runs = {table.name: table for table in include_tables(metadata)}["fastapi_jobs_runs"]
    assert [index.name for index in runs.indexes] == ["ix_fastapi_jobs_runs_job"]
    assert runs.primary_key.name == "pk_fastapi_jobs_runs"


def test_the_store_tables_stay_in_the_default_schema() -> None:
    """A MetaData with a default schema keeps the app's tables there and the
    store's where the store looks for them (the connection's default schema)."""
    metadata = sa.MetaData(schema="app")
    notes = sa.Table("notes", metadata, sa.Column("id", sa.Integer, primary_key=True))
    added = include_tables(metadata)
    assert notes.schema == "app"
    assert sorted((table.schema, table.name) for table in added) == [
        (None, name) for name in STORE_TABLES
    ]
    assert sorted(metadata.tables) == ["app.notes", *STORE_TABLES]


def test_including_twice_adds_nothing_and_a_table_of_the_app_is_refused() -> None:
    """Again on the same metadata: the same tables, nothing added. A table of the
    app's under a store name, or a prefix the store refuses: ConfigurationError."""
    metadata = sa.MetaData()
    first = include_tables(metadata)
    assert include_tables(metadata) == first
    assert len(metadata.tables) == 7
    with pytest.raises(ConfigurationError, match="prefix"):
        include_tables(metadata, table_prefix="p" * 53)
    theirs = sa.MetaData()
    sa.Table("jobs_runs", theirs, sa.Column("id", sa.Integer, primary_key=True))
    with pytest.raises(
        ConfigurationError, match=r"a table of its own named 'jobs_runs': give the store another"
    ):
        include_tables(theirs, table_prefix="jobs_")
    assert list(theirs.tables) == ["jobs_runs"]  # nothing added


def test_the_filter_on_the_page_keeps_the_store_tables() -> None:
    """The page's include_name keeps the app's tables and the store's, and leaves
    out a table that is in the database but in neither."""
    metadata = sa.MetaData()
    sa.Table("notes", metadata, sa.Column("id", sa.Integer, primary_key=True))
    include_tables(metadata)
    namespace: dict[str, Any] = {"target_metadata": metadata}
    exec(fragment("a filter of env.py"), namespace)
    include_name = namespace["include_name"]
    assert all(include_name(name, "table", {}) for name in ["notes", *STORE_TABLES])
    assert not include_name("someone_elses", "table", {})
    assert include_name("ix_fastapi_jobs_runs_job", "index", {"table_name": "fastapi_jobs_runs"})


def test_the_ddl_on_the_page_prints_the_store_tables() -> None:
    """The page's DDL fragment prints the seven CREATE TABLEs."""
    out = io.StringIO()
    with redirect_stdout(out):
        exec(fragment("the DDL"), {})
    assert re.findall(r"CREATE TABLE (\w+)", out.getvalue()) == STORE_TABLES


async def make_with_ddl(engine: AsyncEngine, database_url: str) -> None:
    """The store's tables, made by the DDL it prints (as a migration tool would)."""
    dialect = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    async with engine.begin() as conn:
        for statement in SQLAlchemyStore.ddl(dialect).split(";"):
            if statement.strip():
                await conn.execute(sa.text(statement))


async def table_names(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda sync: sorted(sa.inspect(sync).get_table_names()))


async def test_without_create_tables_a_dropped_table_is_never_made_again(
    database_url: str, on_statement: Callable[[Callable[..., None]], None]
) -> None:
    """create_tables=False, a table dropped under a running store: the claims
    fail with an error naming the migration to make (Alembic's too), every time,
    and the store sends no CREATE or ALTER."""
    engine = create_async_engine(database_url)
    try:
        await make_with_ddl(engine, database_url)
        async with open_store(engine, create_tables=False) as store:
            assert await claim1(store, "digest", 10.0) == 1
            await release1(store, "digest", 1, "ok", None, 0.1)
            async with engine.begin() as conn:
                await conn.execute(sa.text("DROP TABLE fastapi_jobs_claims"))
            ddl = ddl_sent(on_statement, "CREATE|ALTER")
            errors: list[BaseException] = []
            for tick in (11.0, 12.0, 13.0):
                try:
                    await claim1(store, "digest", tick)
                except (StoreError, sa.exc.DBAPIError) as exc:
                    errors.append(exc)
            # The first claim meets the missing table; each one after, the check.
            assert len(errors) == 3
            for error in errors[1:]:
                assert isinstance(error, StoreError)
                assert "fastapi_jobs_claims do not exist" in str(error)
                assert "alembic revision --autogenerate" in str(error)
                assert "SQLAlchemyStore.ddl()" in str(error)
        assert ddl == []
        assert "fastapi_jobs_claims" not in await table_names(engine)
    finally:
        await engine.dispose()


async def test_without_create_tables_a_missing_column_names_the_migration(
    database_url: str,
) -> None:
    """A table that lacks a column the store writes (an earlier release's, or an
    incomplete migration) is refused before any claim, naming the column, the
    migration and its ALTER TABLE; the column is not added."""
    engine = create_async_engine(database_url)
    try:
        await make_with_ddl(engine, database_url)
        async with engine.begin() as conn:
            await conn.execute(sa.text("ALTER TABLE fastapi_jobs_runs DROP COLUMN instance"))
        async with open_store(engine, create_tables=False) as store:
            with pytest.raises(StoreError) as refused:
                await claim1(store, "digest", 10.0)
        message = str(refused.value)
        assert "column(s) fastapi_jobs_runs.instance do not exist" in message
        assert "alembic revision --autogenerate" in message
        assert (
            "add it with ALTER TABLE fastapi_jobs_runs ADD COLUMN instance VARCHAR(200)" in message
        )
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda sync: [c["name"] for c in sa.inspect(sync).get_columns("fastapi_jobs_runs")]
            )
        assert "instance" not in columns
    finally:
        await engine.dispose()


async def test_with_create_tables_a_missing_column_is_added(database_url: str) -> None:
    """create_tables=True adds any column a table lacks that can be added to a
    table with rows (NULL allowed or a default), not only the pauses' version:
    a run is then recorded with it."""
    engine = create_async_engine(database_url)
    try:
        await make_with_ddl(engine, database_url)
        async with engine.begin() as conn:
            await conn.execute(sa.text("ALTER TABLE fastapi_jobs_runs DROP COLUMN error"))
        async with open_store(engine) as store:
            assert await claim1(store, "digest", 10.0) == 1
            await release1(store, "digest", 1, "failed", "ValueError: boom", 0.1)
            assert [(r.outcome, r.error) for r in await store.runs("digest", 10)] == [
                ("failed", ErrorInfo(type="ValueError", message="boom"))
            ]
    finally:
        await engine.dispose()
