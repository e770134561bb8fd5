"""A set of schedules applied to the store's table in one transaction, on every
backend: made, changed, removed and left as they are; refused whole when a name
is another's or the bound is passed; two applies of one group at once."""

from __future__ import annotations

import anyio
import pytest

from fastapi_jobs import NameTakenError, TooManySchedulesError
from fastapi_jobs.stores import SQLAlchemyStore

from .test_store import opened

WITHIN = 60.0


def spec(n: int, every: int = 60) -> tuple[str, str]:
    return ("report", f'{{"every":{every},"n":{n}}}')


async def live(store: SQLAlchemyStore) -> dict[str, tuple[str | None, int, str]]:
    return {r.name: (r.group, r.version, r.spec) for r in await store.schedules.changes(0)}


async def test_a_set_is_made_then_applied_again_untouched(database_url: str) -> None:
    """Applying the same set twice writes nothing the second time: versions kept."""
    async with opened(database_url) as (store, _):
        wanted = {f"t-{n}": spec(n) for n in range(2_000)}
        first = await store.schedules.apply("tenants", wanted, None, WITHIN)
        assert [r.name for r in first.created] == list(wanted)
        assert (first.changed, first.removed, first.unchanged) == ([], [], 0)
        assert all(r.group == "tenants" and not r.removed for r in first.created)
        before = await live(store)
        assert len(before) == 2_000
        again = await store.schedules.apply("tenants", wanted, None, WITHIN)
        assert (again.created, again.changed, again.removed) == ([], [], [])
        assert again.unchanged == 2_000
        assert await live(store) == before


async def test_only_what_differs_is_changed_and_what_is_left_out_removed(
    database_url: str,
) -> None:
    """A changed spec bumps that row's version alone; a name left out is removed
    (a row marked, for the instances reading changes); a new one is made."""
    async with opened(database_url) as (store, _):
        await store.schedules.apply("g", {"a": spec(1), "b": spec(2), "c": spec(3)}, None, WITHIN)
        before = await live(store)
        answer = await store.schedules.apply(
            "g", {"a": spec(1), "b": spec(2, every=30), "d": spec(4)}, None, WITHIN
        )
        assert [r.name for r in answer.created] == ["d"]
        assert [r.name for r in answer.changed] == ["b"]
        assert [r.name for r in answer.removed] == ["c"]
        assert answer.unchanged == 1
        after = await live(store)
        assert set(after) == {"a", "b", "d"}
        assert after["a"] == before["a"]
        assert after["b"][1] > before["b"][1] and after["b"][2] == spec(2, every=30)[1]
        removal = [r for r in await store.schedules.changes(1) if r.name == "c"]
        assert removal[0].removed and removal[0].version > before["c"][1]
        # Made again under the removed name: taken over, its version goes on growing.
        back = await store.schedules.apply("g", {"a": spec(1), "c": spec(3)}, None, WITHIN)
        assert [r.name for r in back.created] == ["c"]
        assert back.created[0].version > removal[0].version


async def test_groups_leave_each_other_and_schedules_made_by_name_alone(
    database_url: str,
) -> None:
    """An empty set removes its group's schedules only; a name another group or
    add_schedule holds refuses the whole set, nothing written."""
    async with opened(database_url) as (store, _):
        await store.schedules.apply("acme", {"acme-1": spec(1)}, None, WITHIN)
        await store.schedules.apply("globex", {"globex-1": spec(2)}, None, WITHIN)
        await store.schedules.create("by-name", "report", spec(3)[1])
        before = await live(store)
        for taken in ("globex-1", "by-name"):
            with pytest.raises(NameTakenError, match=rf"'{taken}'.*nothing was applied"):
                await store.schedules.apply(
                    "acme", {"acme-2": spec(5), taken: spec(6)}, None, WITHIN
                )
        assert await live(store) == before
        emptied = await store.schedules.apply("acme", {}, None, WITHIN)
        assert [r.name for r in emptied.removed] == ["acme-1"]
        assert set(await live(store)) == {"globex-1", "by-name"}
        # A schedule made by name over a grouped removal's row is in no group.
        made = await store.schedules.create("acme-1", "report", spec(1)[1])
        assert made is not None and made.group is None


async def test_the_bound_refuses_a_set_and_a_schedule_past_it(database_url: str) -> None:
    """Past ``most`` live schedules, a set (counting what it removes) and a single
    create are refused whole, saying the counts."""
    async with opened(database_url) as (store, _):
        await store.schedules.apply("g", {f"s{n}": spec(n) for n in range(8)}, 10, WITHIN)
        await store.schedules.create("one", "report", "{}", 10)
        with pytest.raises(TooManySchedulesError, match=r"9 schedule.*3 more.*most is 10"):
            await store.schedules.apply("h", {f"h{n}": spec(n) for n in range(3)}, 10, WITHIN)
        # Replacing 8 by 9 of the group: 10 live, within the bound.
        swapped = await store.schedules.apply("g", {f"t{n}": spec(n) for n in range(9)}, 10, WITHIN)
        assert (len(swapped.created), len(swapped.removed)) == (9, 8)
        with pytest.raises(TooManySchedulesError, match="10 schedule"):
            await store.schedules.create("two", "report", "{}", 10)
        assert len(await live(store)) == 10


async def test_two_applies_of_one_group_at_once_leave_one_of_the_sets(
    database_url: str,
) -> None:
    """Applies of one group go one after the other: the group ends as one set
    given, whole, never a mix."""
    async with opened(database_url) as (store, _):
        sets = [{f"x{n}": spec(n) for n in range(300)}, {f"y{n}": spec(n) for n in range(300)}]
        async with anyio.create_task_group() as tg:
            for wanted in sets:
                tg.start_soon(store.schedules.apply, "g", wanted, None, WITHIN)
        names = set(await live(store))
        assert names in ({*sets[0]}, {*sets[1]})


async def test_an_apply_longer_than_the_timeout_stamps_its_versions_at_its_end(
    database_url: str,
) -> None:
    """Instances read the changes from a little before their last read: an
    apply that outlasts the store's timeout stamps every row it wrote again
    before it commits, so none carries a version from its start."""
    async with opened(database_url) as (store, _):
        # The apply's timeout only, not the store's: a close under a 1 ms
        # timeout leaves its connection to the garbage collector.
        operations = store.schedules._ops
        operations.timeout = 0.001
        try:
            answer = await store.schedules.apply(
                "g", {f"s{n}": spec(n) for n in range(3_000)}, None, WITHIN
            )
        finally:
            operations.timeout = store.timeout
        written = answer.created
        assert min(r.version for r in written) / 1e6 >= max(r.updated_at for r in written) - 1e-5
