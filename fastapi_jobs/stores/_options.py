"""The store's options, checked when it is made: each error names the option
and what it takes."""

from __future__ import annotations

from datetime import timedelta
from typing import NamedTuple

from .._checks import flag, is_whole, seconds
from .._errors import ConfigurationError
from ._tables import check_prefix

__all__ = [
    "_MAX_HEARTBEAT",
    "_MAX_HISTORY",
    "_MAX_LEASE",
    "_MIN_HEARTBEAT",
    "Options",
    "check_claims",
    "check_options",
]

# Runs kept per job in the history table, at most.
_MAX_HISTORY = 100_000
# A lease is what a killed holder costs its job; renewals keep long runs going,
# so a long lease buys nothing. Heartbeats faster than this only load the database.
_MAX_LEASE = 86400.0
_MIN_HEARTBEAT = 0.1
# An instance is seen as gone after three missed beats, and its clock offset is
# corrected at each: rarer than an hour, both would go stale for hours.
_MAX_HEARTBEAT = 3600.0
_SAID = "SQLAlchemyStore(): "


class Options(NamedTuple):
    """The options of ``SQLAlchemyStore(...)``, in seconds where they are times."""

    lease: float
    timeout: float
    heartbeat: float
    history: int
    history_max_age: float
    create_tables: bool
    table_prefix: str


def check_options(
    *,
    lease: float | timedelta,
    timeout: float | timedelta,
    heartbeat: float | timedelta,
    history: int,
    history_max_age: float | timedelta,
    create_tables: bool,
    table_prefix: str,
) -> Options:
    """The options, or `ConfigurationError` for the first that is wrong."""
    lease_s, timeout_s, heartbeat_s, history = check_claims(
        lease, timeout, heartbeat, history, said=_SAID
    )
    return Options(
        lease=lease_s,
        timeout=timeout_s,
        heartbeat=heartbeat_s,
        history=history,
        history_max_age=seconds("history_max_age", history_max_age, context=_SAID),
        create_tables=flag("create_tables", create_tables, context=_SAID),
        table_prefix=check_prefix(table_prefix, context=_SAID),
    )


def check_claims(
    lease: float | timedelta,
    timeout: float | timedelta,
    heartbeat: float | timedelta,
    history: int,
    *,
    said: str,
) -> tuple[float, float, float, int]:
    """The options every store takes (``said``: whose, e.g. ``MemoryStore(): ``),
    in seconds: a test's memory store takes only what the SQL store takes."""
    lease_s = seconds("lease", lease, context=said, maximum=_MAX_LEASE)
    timeout_s = seconds("timeout", timeout, context=said)
    heartbeat_s = seconds(
        "heartbeat",
        heartbeat,
        context=said,
        minimum=_MIN_HEARTBEAT,
        maximum=_MAX_HEARTBEAT,
        allow_zero=True,
    )
    if timeout_s >= lease_s / 3:
        raise ConfigurationError(
            f"{said}timeout ({timeout_s:g}s) must be shorter than a third "
            f"of the lease ({lease_s:g}s), so a renewal can fail and be retried in time"
        )
    if not is_whole(history, 0, _MAX_HISTORY):
        raise ConfigurationError(
            f"{said}history={history!r}: the runs kept per job, a whole "
            f"number from 0 (no history) to {_MAX_HISTORY}"
        )
    return lease_s, timeout_s, heartbeat_s, history
