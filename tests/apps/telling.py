"""An observer the multi-process test apps add: each tick an instance did not
run is logged with its reason, so a test that finds a tick run nowhere can say
which instance dropped it, and why (`tests.support.ticks.skips`)."""

from __future__ import annotations

import logging

from fastapi_jobs.observers import TickSkipped

log = logging.getLogger("tests.skips")


class TellSkips:
    def tick_skipped(self, event: TickSkipped) -> None:
        tick = "-" if event.tick is None else repr(event.tick)
        log.info("skip %s %s %s %d", event.job, tick, event.reason, event.ticks)
