"""What the distribution says of itself matches what CI tests and ships."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_classifiers_name_every_python_ci_tests() -> None:
    """requires-python's floor and each newer Python `.ci/run` tests are listed,
    and no Python that CI does not test."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = re.fullmatch(r">=(3\.\d+)", project["requires-python"])
    assert floor is not None
    looped = re.search(r"^for version in ([\d. ]+); do$", (ROOT / ".ci/run").read_text(), re.M)
    assert looped is not None
    tested = {floor.group(1), *looped.group(1).split()}
    listed = {
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert listed == tested


def test_the_license_is_the_whole_mit_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) ")
    assert "Permission is hereby granted, free of charge" in text
    assert text.rstrip().endswith("OTHER DEALINGS IN THE\nSOFTWARE.")
