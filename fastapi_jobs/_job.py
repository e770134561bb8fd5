"""A job as declared: the function, its schedule and its options."""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable
from dataclasses import InitVar, dataclass
from datetime import timedelta
from typing import Any, TypedDict

from ._checks import check_name, flag, seconds
from ._context import JobContext
from ._errors import ConfigurationError, short
from ._policies import Overlap, check_overlap, jitter_of, jittered
from ._schedules import Schedule
from .queues import Handoff, Outbox
from .queues._job_body import handing_off

__all__ = ["OPTIONS", "Job", "JobOptions", "check_options"]


class JobOptions(TypedDict, total=False):
    """A job's options, as ``add_job``, ``every`` and ``cron`` take them (each
    one is written here once; its default is in `Job.build`)."""

    name: str | None
    """The job's name (default: the function's); unique in a scheduler."""
    timeout: float | timedelta | None
    """Cancel a run that takes longer (recorded as ``timed_out``); default: none."""
    run_on_startup: bool
    """Also run once when the scheduler starts (with a store: the current
    period's tick, once across instances); default False."""
    every_instance: bool
    """With a store: run in every instance, unclaimed (for idempotent jobs); default False."""
    catch_up: float | timedelta | None
    """With a store: after downtime, run the latest missed tick once if at most
    this old; default: missed ticks are skipped."""
    retries: int
    """Try a failed run again up to this many times within its tick; default 0."""
    retry_backoff: float | timedelta
    """The first retry waits about this long (seconds), each next one twice as long; default 1."""
    retry_timeouts: bool
    """Whether a run that timed out is retried like a failed one; default True."""
    paused: bool
    """Declared paused: it runs once an operator resumes it; default False."""
    overlap: Overlap
    """What a tick that comes while the job runs does: ``"skip"`` (default: dropped
    and counted), ``"queue_one"`` (runs once right after the run), ``"replace"``
    (cancels the run, recorded as replaced, and runs); see the policies page."""
    jitter: float | timedelta | None
    """Move every tick later by a fixed offset in ``[0, jitter)`` drawn from the
    job's name (the same on every instance); shorter than the interval; default none."""
    enqueue: Handoff | None
    """Hand each tick to a task queue (`fastapi_jobs.queues`): the function
    returns the task's keyword arguments and the run enqueues it under the key
    ``"<job>@<tick>"``; default: the function is the work."""


_BUILT = object()  # Job.build's token

OPTIONS = JobOptions.__optional_keys__
"""The names of the options, to refuse any other."""

DEFAULTS = JobOptions(
    name=None,
    timeout=None,
    run_on_startup=False,
    every_instance=False,
    catch_up=None,
    retries=0,
    retry_backoff=1.0,
    retry_timeouts=True,
    paused=False,
    overlap="skip",
    jitter=None,
    enqueue=None,
)
"""Each option's default, once (the signatures take ``**options``)."""


def check_options(options: JobOptions, where: str) -> None:
    """Refuse a keyword that is no option, as Python refuses one a signature
    lacks: the options arrive as ``**options``, whose keys only the type checker
    knows (``where``: the method that took them)."""
    unknown = options.keys() - OPTIONS
    if unknown:
        wrong = min(unknown)
        close = difflib.get_close_matches(wrong, OPTIONS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise TypeError(
            f"Scheduler.{where}() got an unexpected keyword argument {wrong!r} "
            f"({hint}the options are {', '.join(sorted(OPTIONS))})"
        )


@dataclass(frozen=True, slots=True, eq=False)
class Job:
    """One declared job. Built by ``Scheduler.every``/``cron``/``add_job``."""

    name: str
    func: Callable[..., Any]
    schedule: Schedule
    timeout: float | None
    run_on_startup: bool
    takes_context: bool
    is_async: bool
    every_instance: bool = False
    """Run in every instance, unclaimed (for idempotent jobs)."""
    catch_up: float | None = None
    """After downtime, run the latest missed tick if at most this many seconds old."""
    retries: int = 0
    """A failed run is tried again up to this many times within its tick."""
    retry_backoff: float = 1.0
    """The first retry waits about this long; each next one twice as long."""
    retry_timeouts: bool = True
    """Whether a run that timed out is retried like a failed one."""
    paused: bool = False
    """Declared paused: the job waits for an operator's resume."""
    overlap: Overlap = "skip"
    """What a tick that comes while the job runs does (``JobOptions.overlap``)."""
    jitter: float | None = None
    """The bound its ticks' offset was drawn under, in seconds (``schedule`` is
    then a `Jittered` one, whose ticks are the ones that run); None: none."""
    enqueue: Handoff | None = None
    """A hand-off job's queue: ``func`` is then the function wrapped, and
    enqueues the task it returns."""
    task: str | None = None
    """The job of a schedule made at run time (`Scheduler.add_schedule`): the
    task it runs, ``func`` that task with the schedule's arguments; None for a
    job declared in code."""
    built: InitVar[object] = None
    """Only `build` passes its token: a Job is never made unchecked."""

    def __post_init__(self, built: object) -> None:
        if built is not _BUILT:
            raise ConfigurationError(
                "a Job is made by scheduler.add_job(func, schedule, ...) (or the every() and "
                "cron() decorators), which check it; not by calling Job(...)"
            )

    @property
    def declared_pause(self) -> float:
        """Its ``paused_until`` while no operator paused or resumed it: until
        resumed (inf) if declared paused, else none (0)."""
        return math.inf if self.paused else 0.0

    @classmethod
    def build(
        cls,
        func: object,
        schedule: Schedule,
        options: JobOptions,
        *,
        where: str = "add_job",
        outbox: Callable[[], Outbox | None] | None = None,
        task: str | None = None,
    ) -> Job:
        """Check ``func``, ``schedule`` and ``options`` (as ``Scheduler.where()``
        took them) and make the job; `ConfigurationError` says what to fix.
        ``outbox``: gives the store's at each run (a hand-off); ``task``: a stored schedule's."""
        check_options(options, where)
        if not callable(func):
            raise ConfigurationError(f"a job must be a function (async or sync), got {func!r}")
        o: JobOptions = {**DEFAULTS, **options}
        name = _checked(func, schedule, o["name"])
        said = f"job {name!r}: "
        is_async = _is_async_job(name, func)
        takes_context = _takes_context(name, func)
        handoff = o["enqueue"]
        overlap = check_overlap(name, o["overlap"], is_async=is_async, handoff=bool(handoff))
        schedule = jittered(name, schedule, o["jitter"])
        if handoff is not None:
            func = handing_off(
                name,
                func,
                _handoff(name, handoff),
                is_async=is_async,
                takes_context=takes_context,
                outbox=outbox,
            )
            is_async = takes_context = True
        return cls(
            name=name,
            func=func,
            schedule=schedule,
            timeout=_seconds(name, "timeout", o["timeout"]),
            run_on_startup=flag("run_on_startup", o["run_on_startup"], context=said),
            takes_context=takes_context,
            is_async=is_async,
            every_instance=flag("every_instance", o["every_instance"], context=said),
            catch_up=_seconds(name, "catch_up", o["catch_up"]),
            retries=_retries(name, o["retries"]),
            retry_backoff=seconds(
                "retry_backoff",
                o["retry_backoff"],
                context=said,
                allow_zero=True,
                maximum=MAX_BACKOFF,
            ),
            retry_timeouts=flag("retry_timeouts", o["retry_timeouts"], context=said),
            paused=flag("paused", o["paused"], context=said),
            overlap=overlap,
            jitter=jitter_of(schedule),
            enqueue=handoff,
            task=task,
            built=_BUILT,
        )


def _checked(func: object, schedule: object, name: str | None) -> str:
    """The job's name, once ``schedule`` is known to be one."""
    if not isinstance(schedule, Schedule):
        raise ConfigurationError(
            f"a job's schedule must be a Schedule such as Every(...) or Cron(...), got {schedule!r}"
        )
    if name is None:
        name = getattr(func, "__name__", None)
        if not name or name == "<lambda>":
            raise ConfigurationError(
                f"cannot tell the name of job {func!r}: give it one with name="
            )
    return check_name(name)


def _is_async_job(name: str, func: object) -> bool:
    """Whether ``func`` is awaited (else run in a thread); a generator is refused."""
    flags = _code_flags(func)
    if flags is None:
        is_async = _is_async(func)
        generator = inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func)
    else:
        is_async = bool(flags & inspect.CO_COROUTINE)
        generator = bool(flags & (inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR))
    if generator:
        raise ConfigurationError(
            f"job {name!r} is a generator function: calling it runs none of its "
            "body. Use return instead of yield (or loop over the generator inside "
            "the job)"
        )
    return is_async


def _handoff(name: str, handoff: object) -> Handoff:
    if not isinstance(handoff, Handoff) or not isinstance(getattr(handoff, "name", None), str):
        raise ConfigurationError(
            f"job {name!r}: enqueue={short(handoff)}: pass a hand-off such as "
            "fastapi_jobs.queues.arq.ArqTask('task_name', pool=...) (an object with a "
            "name and an async enqueue(request))"
        )
    return handoff


MAX_RETRIES = 100
"""More tries than this within one tick is a loop, not a retry."""
MAX_BACKOFF = 86400.0


def _retries(name: str, retries: object) -> int:
    if not isinstance(retries, int) or isinstance(retries, bool):
        raise ConfigurationError(
            f"job {name!r}: retries={short(retries)}: pass a whole number from 0 to {MAX_RETRIES}"
        )
    if not 0 <= retries <= MAX_RETRIES:
        raise ConfigurationError(
            f"job {name!r}: retries={retries}: must be from 0 to {MAX_RETRIES}"
        )
    return retries


def _seconds(name: str, option: str, value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    return seconds(option, value, context=f"job {name!r}: ")


def _code_flags(func: object) -> int | None:
    """The code flags of a plain function (what inspect's checks read, at a
    fraction of their cost); None for anything else, which inspect handles."""
    while isinstance(func, functools.partial) and not hasattr(func, "_is_coroutine_marker"):
        func = func.func  # as inspect's checks unwrap it (stored schedules' jobs)
    if type(func) is types.FunctionType and not hasattr(func, "_is_coroutine_marker"):
        return func.__code__.co_flags  # not marked by inspect.markcoroutinefunction
    return None


def _is_async(func: object) -> bool:
    target = getattr(func, "func", func)  # functools.partial
    if inspect.iscoroutinefunction(target):
        return True
    # An instance whose class defines `async def __call__`.
    return not inspect.isroutine(target) and inspect.iscoroutinefunction(type(target).__call__)


# Signature checks cost ~20 µs; jobs made by one factory share their code, so
# with thousands of jobs the answer is worth keeping per code object.
_SIGNATURES: dict[tuple[object, ...], bool] = {}


def _takes_context(name: str, func: Callable[..., Any]) -> bool:
    # A function with keyword arguments bound (the jobs of stored schedules,
    # 100,000 of one task): the answer depends on which names are bound only.
    target, bound = func, None
    if isinstance(func, functools.partial) and not func.args:
        target, bound = func.func, frozenset(func.keywords)
    if not inspect.isfunction(target):
        return _check_signature(name, func)
    code = target.__code__
    if bound is None and not (code.co_argcount or code.co_kwonlyargcount):
        # No parameter (bar *args, **kwargs) that could take the context. Asked
        # before __annotations__, which Python makes into a dict on first read:
        # ~0.18 KiB a job, for a job that says `-> None`.
        return False
    try:
        key = (
            target.__code__,
            target.__defaults__,
            tuple(target.__kwdefaults__ or ()),
            tuple(target.__annotations__.items()),
            bound,
        )
        takes = _SIGNATURES.get(key)
    except TypeError:  # an unhashable default or annotation: check every time
        return _check_signature(name, func)
    if takes is None:
        takes = _SIGNATURES[key] = _check_signature(name, func)
    return takes


def _check_signature(name: str, func: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # some builtins have no signature
        return False
    kinds = inspect.Parameter
    required = [
        p
        for p in sig.parameters.values()
        if p.default is p.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
    ]
    if not required:
        return False
    hint = _annotation(func, required[0])
    fits = (
        len(required) == 1
        and required[0].kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        and hint in (JobContext, kinds.empty, "JobContext")
    )
    if not fits:
        listing = ", ".join(p.name for p in required)
        raise ConfigurationError(
            f"job {name!r} takes ({listing}): a job takes no parameters, or one "
            "parameter annotated JobContext, e.g. `async def job(ctx: JobContext)`"
        )
    return True


def _annotation(func: Callable[..., Any], param: inspect.Parameter) -> object:
    annotation = param.annotation
    if isinstance(annotation, str):
        # `from __future__ import annotations` leaves strings; resolve them
        # where we can, and fall back to the name for locally defined types.
        target = getattr(func, "func", func)
        try:
            hints = typing.get_type_hints(target)
        except Exception:  # noqa: BLE001 - an unresolvable hint is not our error
            return annotation.rsplit(".", 1)[-1]
        return hints.get(param.name, annotation)
    return annotation
