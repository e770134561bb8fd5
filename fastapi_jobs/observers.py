"""Run hooks: an observer is told when runs start and end, when ticks are
skipped and when a lease is lost.

Subclass `Observer` and override what you need (plain methods are
called in the job's task; ``async def`` ones are queued and awaited in order)::

    from fastapi_jobs.observers import Observer, RunFinished

    class Alerts(Observer):
        def run_finished(self, event: RunFinished) -> None:
            if event.outcome != "ok":
                ...  # page someone: event.job, event.error

    scheduler = Scheduler(observers=[Alerts()])
"""

from __future__ import annotations

from ._core.observers import LeaseLost, Observer, RunFinished, RunStarted, TickSkipped

__all__ = ["LeaseLost", "Observer", "RunFinished", "RunStarted", "TickSkipped"]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
