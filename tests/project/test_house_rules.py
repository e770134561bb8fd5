"""The library's size rule: a function under 60 lines. The dispatcher's per-tick
pass is the one exception: it is inlined on purpose (its comment says why).
Modules have no such rule: a module holds one concept, whatever its length
(issue 32; a line count had been splitting concepts across files)."""

from __future__ import annotations

import ast
from pathlib import Path

import fastapi_jobs

PACKAGE = Path(fastapi_jobs.__file__).parent
LONGEST_FUNCTION = 60
INLINED = {("_core/dispatcher.py", "_dispatch")}  # the hot path, measured


def test_no_function_is_past_60_lines() -> None:
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                where = str(path.relative_to(PACKAGE))
                if lines > LONGEST_FUNCTION and (where, node.name) not in INLINED:
                    long[f"{where}:{node.name}"] = lines
    assert long == {}
