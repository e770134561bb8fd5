"""What users pass, checked one way: durations, flags and job names.

A duration is a number of seconds (int or float, never a bool) or a
``timedelta``; it must be finite and within the bounds of the option that
takes it. Every option checks through `seconds`, so they refuse alike
and their messages read alike.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TypeGuard

from ._errors import ConfigurationError, short

__all__ = ["MAX_NAME", "check_name", "flag", "is_aware", "is_whole", "seconds"]

_DOT_SEGMENTS = (".", "..")
MAX_NAME = 200
"""The longest job name: the claims table holds 200 characters, and a name
shows up in URLs and in every log line of the job."""


def seconds(
    option: str,
    value: object,
    *,
    context: str = "",
    minimum: float = 0.0,
    maximum: float = math.inf,
    allow_zero: bool = False,
    unit: str = "seconds",
) -> float:
    """``value`` as float seconds, or `ConfigurationError` saying why not.
    ``unit``: what the number counts, as the messages say it (``every(hours=)``
    counts hours; only seconds may be a timedelta).

    Messages read ``<context><option>=<value>: <what is wrong>``, e.g.
    ``job 'digest': timeout=-1: must be > 0 seconds``. ``minimum`` is exclusive
    unless ``allow_zero``.
    """
    said = f"{context}{option}={short(value)}"
    if isinstance(value, timedelta) and unit == "seconds":
        number: object = value.total_seconds()
    elif isinstance(value, timedelta):
        raise ConfigurationError(f"{said}: a number of {unit}, not a timedelta")
    else:
        number = value
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        took = f"a number of {unit}" + (" or a timedelta" if unit == "seconds" else "")
        raise ConfigurationError(f"{said}: not a duration; pass {took}")
    try:
        result = float(number)
    except OverflowError:  # an int too large for a float
        result = math.inf
    if math.isnan(result) or math.isinf(result):
        raise ConfigurationError(f"{said}: must be a finite number of {unit}")
    too_small = result < minimum if allow_zero else result <= minimum
    if too_small:
        bound = ">=" if allow_zero else ">"
        raise ConfigurationError(f"{said}: must be {bound} {minimum:g} {unit}")
    if result > maximum:
        raise ConfigurationError(f"{said}: too long; the most it takes is {maximum:g} {unit}")
    return result


def is_whole(value: object, low: float = -math.inf, high: float = math.inf) -> TypeGuard[int]:
    """Whether ``value`` is a whole number (an ``int``, not a ``bool``) from
    ``low`` to ``high``. Each caller says in its own words what the number is."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def is_aware(value: datetime) -> bool:
    """Whether ``value`` names one instant (a time zone that gives an offset)."""
    return value.tzinfo is not None and value.utcoffset() is not None


def flag(option: str, value: object, *, context: str = "") -> bool:
    """``value`` if it is a bool, else `ConfigurationError`. A string
    such as ``"false"`` (read from an environment variable) is true to Python:
    taken as given, it would turn on what the user meant to turn off."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{context}{option}={short(value)}: pass True or False")
    return value


def check_name(name: object) -> str:
    """``name`` if every place a job's name goes can carry it, else a
    `ConfigurationError` saying the rule.

    Names go into a URL path (``/jobs/{name}``), log lines, and a
    ``VARCHAR(200)`` of the claims table on PostgreSQL, which refuses NUL
    characters and text that is not valid UTF-8.
    """
    # The common case first, checked in C: thousands of jobs register fast.
    if (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME
        and name.isprintable()
        and name == name.strip()
        and "/" not in name
        and name not in _DOT_SEGMENTS
    ):
        return name
    rule = (
        f"use 1 to {MAX_NAME} printable characters, no '/', no control "
        "characters, no spaces at either end, and not '.' or '..'"
    )
    if not isinstance(name, str):
        raise ConfigurationError(f"job name {short(name)} is not a string: {rule}")
    shown = short(name)
    if name in _DOT_SEGMENTS:
        raise ConfigurationError(
            f"job name {shown} is not usable: browsers and clients resolve '.' and '..' "
            f"in a URL path (/jobs/{name}/run is not that job's); {rule}"
        )
    if not name or len(name) > MAX_NAME or name != name.strip() or "/" in name:
        raise ConfigurationError(f"job name {shown} is not usable: {rule}")
    # Printable as Python means it: no control or format characters (NUL,
    # newlines, escapes that forge log lines, zero-width marks), and no lone
    # surrogates, which no UTF-8 database can store.
    odd = next(char for char in name if not char.isprintable())
    raise ConfigurationError(f"job name {shown} is not usable: it holds {odd!r}; {rule}")
