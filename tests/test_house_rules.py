"""The library's size rules (issue 17): one concept per module keeps a module
under 400 lines and a function under 60. The dispatcher's per-tick pass is the
one exception: it is inlined on purpose (its comment says why)."""

from __future__ import annotations

import ast
from pathlib import Path

import fastapi_jobs

PACKAGE = Path(fastapi_jobs.__file__).parent
LONGEST_MODULE = 400
LONGEST_FUNCTION = 60
INLINED = {("_dispatcher.py", "_dispatch")}  # the hot path, measured


def test_no_module_is_past_400_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > LONGEST_MODULE
    }
    assert long == {}


def test_no_function_is_past_60_lines() -> None:
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONGEST_FUNCTION and (path.name, node.name) not in INLINED:
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    assert long == {}
