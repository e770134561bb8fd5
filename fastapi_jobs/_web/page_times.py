"""Words for times on the status page: an instant as a ``<time>`` that says how
long ago (or until), a countdown, a duration. The page's script ticks the same
words each second (``static/ui.js``)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from .._clock import as_datetime

__all__ = ["clock", "countdown", "iso", "lasting", "time_tag"]


def iso(ts: float | datetime) -> str:
    at = ts if isinstance(ts, datetime) else as_datetime(ts)
    return at.astimezone(UTC).isoformat(timespec="seconds")


def time_tag(at: datetime, now: float) -> str:
    when = iso(at)
    return f'<time datetime="{when}" title="{when}">{_ago(now - at.timestamp())}</time>'


def _ago(seconds: float) -> str:
    if -1 < seconds < 1:
        return "now"
    words = _span(abs(seconds))
    return f"{words} ago" if seconds > 0 else f"in {words}"


def countdown(seconds: float) -> str:
    return "due" if seconds < 1 else f"in {_span(seconds)}"


def _span(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "a long time"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def clock(ts: float) -> str:
    return as_datetime(ts).strftime("%H:%M:%S UTC")


def lasting(seconds: float) -> str:
    if seconds < 0.001:
        return "<1 ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return _span(seconds)
