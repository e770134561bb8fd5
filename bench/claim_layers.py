"""``python -m bench.claim_layers``: the client CPU of one claim call, layer by layer.

The same claim statement (every row a win, so every row comes back) sent three
ways on a local PostgreSQL 15 through asyncpg: ``store.claim``, the statement
as driver SQL on a SQLAlchemy connection held open (what the kept connection
makes of each call), and asyncpg's own prepared statement; and the JSON
encoding of the rows alone. Medians of ``ITERATIONS`` calls at 1 and at 100
rows: the fixed cost of a call, and what each row adds. Where the store's time
goes, for docs/development/benchmark-notes.md (issue 22); not part of ``python -m bench``.
``--quick``: 5 calls each, for the smoke test.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ITERATIONS = 300
SIZES = (1, 100)

Call = Callable[[list[tuple[str, float]]], Awaitable[int]]


async def _median_cpu(call: Call, size: int, names: list[int], iterations: int) -> float:
    """The median process CPU of ``call`` over fresh rows of ``size`` jobs (new
    names each time: every row is a win)."""
    cpu = []
    for _ in range(iterations):
        names[0] += 1
        rows = [(f"job{names[0]}_{i:04d}", 1_000_000.0) for i in range(size)]
        start = time.process_time()
        answered = await call(rows)
        cpu.append(time.process_time() - start)
        assert answered == size, (answered, size)
    return statistics.median(cpu)


async def layers(url: str, iterations: int = ITERATIONS) -> dict[str, dict[int, float]]:
    import asyncpg  # type: ignore[import-untyped]

    from fastapi_jobs._store import Instance
    from fastapi_jobs.stores import SQLAlchemyStore
    from fastapi_jobs.stores._batches import encode
    from fastapi_jobs.stores._db_clock import sqlite_now

    store = SQLAlchemyStore(url)
    await store.open({}, Instance())
    await store.claim([("warm", 1.0)])  # the tables made, the statements compiled
    sql, names = store._statements.batches._compiled["claim"]
    assert names is not None
    params = store._claim_params()

    def args(rows: list[tuple[str, float]]) -> tuple[Any, ...]:
        sent = {**params, "b_sent": sqlite_now(), "b_rows": encode(rows)}
        return tuple(sent[name] for name in names)

    async def claim(rows: list[tuple[str, float]]) -> int:
        return len(await store.claim(rows))

    async def encoded(rows: list[tuple[str, float]]) -> int:
        encode(rows)
        return len(rows)

    engine = store._operations.engine
    assert engine is not None
    raw = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    prepared = await raw.prepare(sql)
    results: dict[str, dict[int, float]] = {}
    seen = [0]
    try:
        async with engine.connect() as conn:
            # The statement returns the rows claimed and one more: the
            # database's clock (_claim_statements.with_clock).
            async def driver_sql(rows: list[tuple[str, float]]) -> int:
                return len((await conn.exec_driver_sql(sql, args(rows))).all()) - 1

            async def asyncpg_own(rows: list[tuple[str, float]]) -> int:
                return len(await prepared.fetch(*args(rows))) - 1

            ways = {
                "store.claim": claim,
                "exec_driver_sql, connection held": driver_sql,
                "asyncpg prepared statement": asyncpg_own,
                "the rows' JSON encoding alone": encoded,
            }
            for label, call in ways.items():
                results[label] = {n: await _median_cpu(call, n, seen, iterations) for n in SIZES}
    finally:
        await raw.close()
        await store.close()
    return results


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import PostgresServer

    server = PostgresServer()
    server.start()
    try:
        url = server.url(server.create_database())
        results = asyncio.run(layers(url, 5 if "--quick" in sys.argv[1:] else ITERATIONS))
    finally:
        server.destroy()
    small, large = SIZES
    print(f"| layer | {small} row, µs | {large} rows, µs | per further row, µs |")
    print("|---|---|---|---|")
    for label, cpu in results.items():
        one, many = cpu[small] * 1e6, cpu[large] * 1e6
        print(f"| {label} | {one:.0f} | {many:.0f} | {(many - one) / (large - small):.2f} |")


if __name__ == "__main__":
    main()
