"""What the tests need of the machine, asked in one place: a Python package
(Playwright, Hypothesis), a program (Chromium, promtool), a server that must
start (PostgreSQL, PgBouncer, Redis, libfaketime's). Missing here, the tests
that need it skip; in CI (``CI=true``), where .ci/run installs every one, they
fail: a tool that goes missing there must not turn its tests into skips."""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = ["DEV", "in_ci", "missing", "module", "program"]


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set, and not to ``0`` or ``false``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def missing(what: str, remedy: str) -> NoReturn:
    """``what`` is missing here: skip the test (or its whole module, when asked at
    import), but fail it in CI. ``remedy`` says how to get it."""
    if in_ci():
        pytest.fail(f"CI must run the tests that need {what}, but it is missing: {remedy}")
    pytest.skip(f"{what} is missing here: {remedy}", allow_module_level=True)


DEV = "the dev group has it: pip install -e '.[example]' --group dev"


def module(name: str, remedy: str = DEV) -> ModuleType:
    """The Python module ``name``, imported; `missing` if it cannot be."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"the Python module {name!r} ({exc})", remedy)


def program(name: str, remedy: str, *, at: str | None = None) -> str:
    """The path of the program ``name`` (at ``at`` if there, else on the PATH);
    `missing` if there is none."""
    if at is not None and Path(at).exists():
        return at
    found = shutil.which(name)
    if found is None:
        missing(f"the program {name!r}", remedy)
    return found
