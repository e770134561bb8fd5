"""Log lines a person can read under plain ``uvicorn app:app``.

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

__all__ = ["FORMAT", "LIBRARY", "make_visible"]

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
