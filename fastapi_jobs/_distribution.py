"""This project's name on the package index, which is not its import name.

``fastapi-jobs`` there is another project (a job queue that ships its own
``fastapi_jobs`` package), so the distribution is ``fastapi-scheduled-jobs``
while users still write ``import fastapi_jobs``. What a user missing an extra
is told names this distribution, never the other one.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["NAME", "described", "install_hint", "missing_extra"]

NAME = "fastapi-scheduled-jobs"


def install_hint(extra: str) -> str:
    """How to install one of this distribution's extras, by name or from a clone."""
    return (
        f"pip install '{NAME}[{extra}]' (from a clone of its repository: pip install '.[{extra}]')"
    )


def missing_extra(module: str, needs: str, extra: str, package: str) -> ImportError:
    """What importing ``module`` raises when its extra's library (``needs``, from
    the PyPI ``package``) is not installed."""
    return ImportError(
        f"{module} needs {needs}: install {NAME} with its extra [{extra}], "
        f"{install_hint(extra)}, or {package} yourself"
    )


def described() -> str:
    """The distribution and its installed version (``--version``)."""
    try:
        return f"(distribution {NAME}) {version(NAME)}"
    except PackageNotFoundError:  # pragma: no cover - imported from a source tree
        return f"(distribution {NAME}, not installed)"
