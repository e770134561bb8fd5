"""The store's options, checked when it is made: each error names the option
and what it takes."""

from __future__ import annotations

from datetime import timedelta
from typing import NamedTuple

from .._checks import flag, is_whole, seconds
from .._errors import ConfigurationError
from ._tables import check_prefix

__all__ = ["MAX_HEARTBEAT", "MAX_HISTORY", "MAX_LEASE", "MIN_HEARTBEAT", "Options", "check_options"]

# Runs kept per job in the history table, at most.
MAX_HISTORY = 100_000
# A lease is what a killed holder costs its job; renewals keep long runs going,
# so a long lease buys nothing. Heartbeats faster than this only load the database.
MAX_LEASE = 86400.0
MIN_HEARTBEAT = 0.1
# An instance is seen as gone after three missed beats, and its clock offset is
# corrected at each: rarer than an hour, both would go stale for hours.
MAX_HEARTBEAT = 3600.0
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
    lease_s = seconds("lease", lease, context=_SAID, maximum=MAX_LEASE)
    timeout_s = seconds("timeout", timeout, context=_SAID)
    heartbeat_s = seconds(
        "heartbeat",
        heartbeat,
        context=_SAID,
        minimum=MIN_HEARTBEAT,
        maximum=MAX_HEARTBEAT,
        allow_zero=True,
    )
    if timeout_s >= lease_s / 3:
        raise ConfigurationError(
            f"SQLAlchemyStore: timeout ({timeout_s:g}s) must be shorter than a third "
            f"of the lease ({lease_s:g}s), so a renewal can fail and be retried in time"
        )
    if not is_whole(history, 0, MAX_HISTORY):
        raise ConfigurationError(
            f"SQLAlchemyStore(): history={history!r}: the runs kept per job, a whole "
            f"number from 0 (no history) to {MAX_HISTORY}"
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
