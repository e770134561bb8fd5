"""Processes the tests start run under coverage (pyproject's patch = ["subprocess"]
passes it on through the environment), except where a test asserts how soon a
process does something: there the tracer's cost in every call is the process's
own slowness, which the test would then measure instead of the library's."""

from __future__ import annotations

from collections.abc import Mapping


def untraced(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without what starts coverage in a Python process."""
    return {
        k: v
        for k, v in env.items()
        if k not in ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")
    }
