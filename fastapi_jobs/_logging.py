"""Log lines a person can read under plain ``uvicorn app:app``, and the
loggers of jobs that come and go.

uvicorn configures its own loggers only, so a library's records reach Python's
last-resort handler: WARNING and up, bare messages, no time, no process. A
library must not configure the root logger either. So, like uvicorn for its
own loggers, the scheduler gives *its* logger a handler of its own, and only
when nothing else would show its records: an app that set up logging (a root
handler, ``dictConfig``, pytest's capture) sees no change, and adding a
``logging.NullHandler()`` to the ``fastapi_jobs`` logger opts out.
"""

from __future__ import annotations

import logging

__all__ = ["FORMAT", "LIBRARY", "JobLogger", "job_logger", "make_visible"]

FORMAT = "%(asctime)s %(levelname)-7s [%(process)d] %(name)s: %(message)s"
"""Time, level and pid: which of four workers said it, and when."""
LIBRARY = "fastapi_jobs"
"""The logger of what is not a job's run: the store (``.stores``), the metrics
(``.metrics``). With ``Scheduler(logger=...)`` the runs go to the app's logger,
and these stay here: both are made visible."""


def make_visible(logger: logging.Logger) -> None:
    """Give ``logger`` a stderr handler if no handler would show its records.

    Its level is then INFO, or DEBUG (each run with its duration) when uvicorn
    runs with ``--log-level debug``, unless the logger has a level already.
    """
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        server = logging.getLogger("uvicorn.error").level
        logger.setLevel(logging.DEBUG if server == logging.DEBUG else logging.INFO)


_registry = logging.Logger.manager.loggerDict


class JobLogger(logging.Logger):
    """A job's logger, out of logging's registry: named, levelled and handled
    as ``getChild`` would make it. Its parent is looked up at each use, as
    logging would set it (the nearest logger above its name: the app's
    ``fastapi_jobs.acme`` for a job ``acme.report``), and its level too:
    logging clears the cached levels of the loggers it knows of only."""

    @property
    def parent(self) -> logging.Logger | None:
        name = self.name
        dot = name.rfind(".")
        while dot > 0:
            above = _registry.get(name[:dot])
            if isinstance(above, logging.Logger):
                return above
            dot = name.rfind(".", 0, dot)
        return self.root

    @parent.setter
    def parent(self, value: logging.Logger | None) -> None:
        """``Logger.__init__`` sets it: looked up instead."""

    def isEnabledFor(self, level: int) -> bool:
        if self.disabled or self.manager.disable >= level:
            return False
        return level >= self.getEffectiveLevel()


_kinds: dict[type[logging.Logger], type[JobLogger]] = {logging.Logger: JobLogger}


def _kind() -> type[JobLogger]:
    """`JobLogger` on the app's logger class (``logging.setLoggerClass``), if it has one."""
    base = logging.Logger.manager.loggerClass or logging.getLoggerClass()
    kind = _kinds.get(base)
    if kind is None:
        kind = _kinds[base] = type(f"Job{base.__name__}", (JobLogger, base), {})
    return kind


def job_logger(
    logger: logging.Logger, job: str, made: logging.Logger | None = None
) -> logging.Logger:
    """The logger of ``job`` under the scheduler's ``logger``: the one logging
    has under that name if any (the app configured it, or asked for it: its
    level, handlers and filters hold), else a `JobLogger` (``made``, the one
    given before, while it still is the one to use)."""
    if made is not None:
        known = _registry.get(made.name)
        return known if isinstance(known, logging.Logger) else made
    name = job if logger is logger.root else f"{logger.name}.{job}"
    known = _registry.get(name)
    return known if isinstance(known, logging.Logger) else _kind()(name)
