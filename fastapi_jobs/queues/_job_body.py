"""A hand-off job's body: the job's function, then the enqueue of its result.

Built once, when the job is declared (`handing_off`), so that the runner calls
a hand-off job exactly as it calls any async job taking a `JobContext`: the
guarded run, timeouts, retries, claims and history are the existing ones, and
ordinary jobs pay nothing for hand-offs existing.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .._context import JobContext
from .._core.concurrency import in_thread
from .._errors import short
from .._redaction import hidden
from . import Handoff, HandoffRequest, Outbox, handoff_key

__all__ = ["handing_off"]


def _none() -> None:
    """No outbox (a stored schedule's hand-off, or a store without one)."""
    return None


def handing_off(
    name: str,
    func: Callable[..., Any],
    handoff: Handoff,
    *,
    is_async: bool,
    takes_context: bool,
    outbox: Callable[[], Outbox | None] | None,
) -> Callable[[JobContext], Awaitable[None]]:
    """The run of hand-off job ``name``: call ``func`` (in a worker thread if
    sync), then enqueue its keyword arguments with ``handoff`` under the
    tick's key (``outbox``: gives the scheduler's store's outbox at each run,
    for the queues that need it: the store a test gives the scheduler for a
    while, ``testing.virtual``, is the one a run uses). What either raises is
    the run's failure."""

    tried = [math.nan]  # the tick this process last tried to hand off
    outbox_of = outbox or _none

    async def hand_off(ctx: JobContext) -> None:
        outbox = outbox_of()
        tick = ctx.tick.timestamp()
        maybe_sent = tick == tried[0]  # a retry: the first attempt may have gone through
        tried[0] = tick
        if outbox is not None and not maybe_sent:
            maybe_sent = time.time() - tick >= outbox.lease / 2
        args = (ctx,) if takes_context else ()
        if is_async:
            kwargs = await func(*args)
        else:
            # Not abandoned on cancel: the job counts as running until its
            # thread returns, as a sync job does.
            kwargs = await in_thread(func, *args)
        checked = _kwargs(name, kwargs)
        key = handoff_key(name, ctx.tick)
        request = HandoffRequest(name, ctx.tick, key, checked, ctx.state, outbox, maybe_sent)
        job_id = await handoff.enqueue(request)
        ctx.logger.debug(
            "job %r handed tick %s to %s as %r",
            name,
            ctx.tick.isoformat(),
            handoff.name,
            job_id,
            extra={"job": name},
        )

    # Tracing and logs name the user's function, not this wrapper.
    functools.update_wrapper(hand_off, func, assigned=("__module__", "__qualname__", "__doc__"))
    return hand_off


def _kwargs(name: str, kwargs: object) -> Mapping[str, Any]:
    """The task's keyword arguments as the job returned them: a dict of
    JSON-able values keyed by name, or None for none."""
    if kwargs is None:
        return {}
    if inspect.iscoroutine(kwargs):
        kwargs.close()  # never awaited: no warning about it
        raise TypeError(
            f"hand-off job {name!r} is a sync function that returned a coroutine, which "
            "was not awaited: declare the job `async def`"
        )
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(
            f"hand-off job {name!r} returned {short(hidden(kwargs))}: return the queue task's "
            "keyword arguments as a dict keyed by name (or None for none)"
        )
    try:
        # Strict JSON (no NaN): what every queue can carry, whatever it serialises with.
        encoded = json.dumps(kwargs, allow_nan=False)
    except RecursionError:
        raise TypeError(f"hand-off job {name!r} returned kwargs nested too deep for JSON") from None
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"hand-off job {name!r} returned kwargs that are not JSON-able ({exc}): return "
            "plain values (str, int, float, bool, None, lists and dicts of them), e.g. "
            "ctx.tick.isoformat() for the tick"
        ) from None
    # As JSON gives them back: every queue's task then gets the same values (a
    # tuple would reach an arq task as a tuple, a Celery one as a list). Values
    # JSON would change are refused rather than changed without a word.
    parsed: Mapping[str, Any] = json.loads(encoded)
    if parsed != kwargs:
        raise TypeError(
            f"hand-off job {name!r} returned kwargs that JSON would change (a tuple "
            "becomes a list, a dict's int key a string): return lists, and dicts keyed "
            "by strings"
        )
    return parsed
