"""The status page, ``GET /jobs/ui``: server-rendered HTML, no framework.

Every value from a job (its name, its error, an instance's id) goes through
`html.escape`; the page's own style and script are files served beside
it (``/jobs/ui.css``, ``/jobs/ui.js``), so it works under a CSP with no
``'unsafe-inline'`` (the page sends one). Without its script the page still
shows everything, and refreshes by ``<meta http-equiv=refresh>``; with it, the
countdowns tick and the page's body is fetched again and swapped in place,
without a flicker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from importlib.resources import files
from typing import NamedTuple
from urllib.parse import quote, urlencode

from .._status import ClusterView, JobStatus, RunRecord, SchedulerState, state_word
from .page_times import clock, countdown, iso, lasting, time_tag

__all__ = [
    "ASSETS",
    "CHART_RUNS",
    "CSP",
    "NOTICES",
    "PAGE_JOBS",
    "Links",
    "notice_url",
    "render",
    "state_of",
]

CHART_RUNS = 30
"""Runs in each job's chart."""
PAGE_JOBS = 200
"""Jobs on the page at most; a filter (``?q=``) finds the others."""
REFRESH = 5
"""Seconds between two refreshes of the page."""
CSP = (
    "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class Asset(NamedTuple):
    """A file the page loads: its bytes, a hash that versions its URL, its type."""

    body: bytes
    version: str
    media_type: str


def _asset(name: str, media_type: str) -> Asset:
    body = files(__package__).joinpath("static", name).read_bytes()
    return Asset(body, hashlib.sha256(body).hexdigest()[:12], media_type)


ASSETS = {
    "ui.css": _asset("ui.css", "text/css; charset=utf-8"),
    "ui.js": _asset("ui.js", "text/javascript; charset=utf-8"),
    "icon.svg": _asset("icon.svg", "image/svg+xml"),
}
"""The page's style, script and icon, served beside it."""

NOTICES = {
    "started": "Run of {job} started.",
    "paused": "{job} is paused.",
    "resumed": "{job} is resumed.",
    "running": "{job} is running already: not started again.",
    "unknown": "No job has that name.",
    "unavailable": "The store cannot be reached, or the app is stopping: nothing changed.",
    "unsure": "The store did not confirm the change to {job} in time: it may have been made, "
    "and the table below shows whether it was.",
    "invalid": "That request is not valid: nothing changed.",
}
"""What the page says after one of its buttons (``?notice=...&job=...``)."""
_TROUBLE = {"running", "unknown", "unavailable", "unsure", "invalid"}


@dataclass(frozen=True, slots=True)
class Links:
    """Where the page's parts are, with the app's own prefixes."""

    page: str
    css: str
    js: str
    icon: str
    control: str | None
    """The control endpoints' base (``.../jobs``), if the app has them."""

    def action(self, name: str, verb: str) -> str:
        assert self.control is not None
        return f"{self.control}/{quote(name, safe='')}/{verb}"


def render(
    statuses: Sequence[JobStatus],
    runs: Mapping[str, Sequence[RunRecord]],
    view: ClusterView | None,
    *,
    links: Links,
    now: float,
    scheduler: SchedulerState,
    store: bool,
    instance: str,
    notice: str | None = None,
    notice_job: str | None = None,
    query: str = "",
    state: str | None = None,
    total: int | None = None,
    matched: int | None = None,
    pages: tuple[str | None, str | None] = (None, None),
    unknown: Sequence[tuple[str, str, str]] = (),
) -> str:
    """The page, for the scheduler's ``statuses`` at ``now`` (POSIX seconds):
    those shown, of ``matched`` jobs whose name holds ``query`` (in ``state``),
    of ``total``, with the links to the first and the next page (``pages``);
    and the stored schedules this instance cannot run (``unknown``: each one's
    name, task and why)."""
    total = len(statuses) if total is None else total
    matched = len(statuses) if matched is None else matched
    out = _head(links, now, total, scheduler, instance)
    if scheduler != "running":
        out.append(_SCHEDULER_SAID[scheduler])
    if notice in NOTICES:
        text = NOTICES[notice].format(job=f"<code>{escape(notice_job or '?')}</code>")
        kind = "trouble" if notice in _TROUBLE else "done"
        out.append(f'<p class="notice {kind}" role="status">{text}</p>\n')
    if store and view is None:
        out.append(
            '<p class="notice trouble" role="status">The store cannot be read: '
            "what other instances did is not shown.</p>\n"
        )
    if total > len(statuses) or query or state or unknown or any(pages):
        out.append(_filter(query, state, len(statuses), matched, links.page))
    if statuses:
        # Where a run ran says something only when there are several instances.
        several = view is not None and len(view.instances) > 1
        out.append(_table(statuses, runs, links, now, several))
    elif not query and not state:
        out.append('<p class="empty">No jobs are declared.</p>\n')
    if any(pages):
        out.append(_pages(*pages))
    if unknown:
        out.append(_unknown(unknown))
    if view is not None:
        out.append(_instances(view, instance, now))
    out.append("</main>\n</body>\n</html>\n")
    return "".join(out)


_SCHEDULER_SAID = {
    "never_started": '<p class="notice trouble" role="alert">The scheduler never started, '
    "so no job runs: this app did not run its lifespan. Write "
    "<code>FastAPI(lifespan=scheduler.lifespan)</code>, and give the app's own lifespan to "
    "<code>Scheduler(lifespan=...)</code>. A mounted app's lifespan does not run: give it "
    "to the app that is served.</p>\n",
    "stopped": '<p class="notice trouble" role="status">The scheduler has stopped: the app '
    "is shutting down.</p>\n",
}
"""What the page says above its jobs when the scheduler does not run."""


def _head(
    links: Links, now: float, total: int, scheduler: SchedulerState, instance: str
) -> list[str]:
    """The page up to its notices: the document's head, and the header that
    counts the jobs and says who answered when."""
    return [
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="color-scheme" content="light dark">\n'
        "<title>Jobs</title>\n",
        f'<link rel="stylesheet" href="{escape(links.css)}">\n',
        f'<link rel="icon" href="{escape(links.icon)}" type="image/svg+xml">\n',
        f'<script src="{escape(links.js)}" defer></script>\n',
        f'<noscript><meta http-equiv="refresh" content="{REFRESH * 3}"></noscript>\n',
        "</head>\n<body>\n",
        f'<main id="jobs" data-refresh="{REFRESH}" data-now="{iso(now)}">\n',
        "<header><h1>Jobs</h1>",
        f'<p class="meta">{total} job{"" if total == 1 else "s"} · ',
        "scheduler running"
        if scheduler == "running"
        else f'<strong class="bad">scheduler {scheduler.replace("_", " ")}</strong>',
        f" · answered by <code>{escape(instance)}</code> at "
        f'<time datetime="{iso(now)}">{clock(now)}</time></p>',
        "</header>\n",
    ]


def _table(
    statuses: Sequence[JobStatus],
    runs: Mapping[str, Sequence[RunRecord]],
    links: Links,
    now: float,
    several: bool,
) -> str:
    """The table of the jobs shown, a row each."""
    out = [
        '<table class="jobs">\n<thead><tr><th scope="col">Job</th><th scope="col">State'
        '</th><th scope="col">Schedule</th><th scope="col">Next run</th>'
        '<th scope="col">Last run</th><th scope="col">Recent runs</th>'
    ]
    out.append('<th scope="col"><span class="sr">Actions</span></th>' if links.control else "")
    out.append("</tr></thead>\n<tbody>\n")
    for status in statuses:
        out.append(_row(status, runs.get(status.name, ()), links, now, several))
    out.append("</tbody>\n</table>\n")
    return "".join(out)


def state_of(status: JobStatus) -> str:
    """The word of the state column (also the row's class)."""
    cluster = status.cluster
    return state_word(
        status.paused,
        status.running or (cluster is not None and cluster.running_on is not None),
        cluster.last_outcome if cluster is not None else status.last_outcome,
    )


_OVERLAP_SAID = {"queue_one": "waits for it (one)", "replace": "replaces it"}


def _row(
    status: JobStatus, runs: Sequence[RunRecord], links: Links, now: float, several: bool
) -> str:
    name = escape(status.name)
    state = state_of(status)
    cells = [
        f'<tr class="job {state.replace(" ", "-")}" data-job="{name}">',
        f'<th scope="row" data-label="Job"><code>{name}</code></th>',
        f'<td data-label="State"><span class="state {state.replace(" ", "-")}">{state}</span>',
    ]
    if status.paused and status.paused_until is not None:
        cells.append(f'<br><span class="sub">until {time_tag(status.paused_until, now)}</span>')
    cells.append(f'</td><td data-label="Schedule">{escape(status.schedule)}')
    if status.overlap != "skip":  # the default goes unsaid
        said = _OVERLAP_SAID.get(status.overlap, status.overlap)
        cells.append(f'<br><span class="sub policy">a tick during a run {escape(said)}</span>')
    if status.hand_off is not None:  # its run is an enqueue: say where to
        cells.append(f'<br><span class="sub">hands off to {escape(status.hand_off)}</span>')
    if status.task is not None:  # a row of the store, not the code
        cells.append(
            f'<br><span class="sub made">made at run time · task <code>{escape(status.task)}'
            "</code></span>"
        )
    cells.append("</td>")
    nxt = status.next_run_at
    if status.paused:  # its ticks are skipped: no countdown to one that will not run
        cells.append('<td data-label="Next run"><span class="sub">none while paused</span></td>')
    elif nxt is None:
        cells.append('<td data-label="Next run"><span class="sub">—</span></td>')
    else:
        cells.append(
            f'<td data-label="Next run"><time datetime="{iso(nxt)}" '
            f"data-countdown>{countdown(nxt.timestamp() - now)}</time></td>"
        )
    cells.append(f'<td data-label="Last run">{_last_run(status, now, several)}</td>')
    cells.append(f'<td data-label="Recent runs">{_chart(runs)}{_run_count(status)}</td>')
    if links.control:
        cells.append(f'<td class="actions">{_buttons(status, links)}</td>')
    cells.append("</tr>\n")
    return "".join(cells)


def _last_run(status: JobStatus, now: float, several: bool) -> str:
    cluster = status.cluster
    if cluster is not None:
        finished, outcome = cluster.last_finished_at, cluster.last_outcome
        duration, where = cluster.last_duration_s, cluster.running_on or cluster.last_instance
        failed = outcome in ("failed", "timed_out") and cluster.last_error is not None
        error = str(cluster.last_error) if failed else None
    else:
        finished, outcome, duration, where = (
            status.last_finished_at,
            status.last_outcome,
            status.last_duration_s,
            None,
        )
        failed = outcome in ("failed", "timed_out") and status.last_error is not None
        error = str(status.last_error) if failed else None
    if finished is None and outcome is None:
        return '<span class="sub">—</span>'
    parts = []
    if finished is not None:
        parts.append(time_tag(finished, now))
    if outcome is not None:
        parts.append(f'<span class="outcome {outcome}">{outcome.replace("_", " ")}</span>')
    if duration is not None:
        parts.append(lasting(duration))
    text = " · ".join(parts)
    if where and several:
        text += f'<br><span class="sub">on <code>{escape(where)}</code></span>'
    if error:
        text += f'<div class="error">{escape(error)}</div>'
    return text


def _run_count(status: JobStatus) -> str:
    """How many times the job ran, and where that count was kept: with a store,
    by every instance (the claims); else by this process, which a page of
    another worker counts apart."""
    if status.cluster is not None:
        count, where = status.cluster.runs, "on all instances"
    else:
        count, where = status.runs, "in this process"
    return f'<br><span class="sub runs">{count} run{"" if count == 1 else "s"} {where}</span>'


def _chart(runs: Sequence[RunRecord]) -> str:
    shown = list(runs[:CHART_RUNS])[::-1]  # oldest first, left to right
    if not shown:
        return '<span class="sub">—</span>'
    longest = max((r.duration_s or 0.0) for r in shown) or 1.0
    bar, gap, height = 6, 2, 24
    width = len(shown) * (bar + gap) - gap
    counts: dict[str, int] = {}
    rects = []
    for k, run in enumerate(shown):
        outcome = run.outcome or "cancelled"
        counts[outcome] = counts.get(outcome, 0) + 1
        duration = run.duration_s or 0.0
        h = max(2, round(height * duration / longest))
        when = "" if run.started_at is None else run.started_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        tip = f"{when} · {outcome.replace('_', ' ')} · {lasting(duration)}"
        if run.error is not None:
            tip += f" · {run.error}"
        if run.queue_id is not None:
            tip += f" · queued as {run.queue_id}"
        rects.append(
            f'<rect class="{outcome}" x="{k * (bar + gap)}" y="{height - h}" width="{bar}" '
            f'height="{h}"><title>{escape(tip)}</title></rect>'
        )
    label = ", ".join(f"{n} {o.replace('_', ' ')}" for o, n in counts.items())
    return (
        f'<svg class="chart" role="img" aria-label="last {len(shown)} runs: {label}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        + "".join(rects)
        + "</svg>"
    )


def _buttons(status: JobStatus, links: Links) -> str:
    name = status.name
    toggle = ("resume", "Resume") if status.paused else ("pause", "Pause")
    return "".join(
        f'<form method="post" action="{escape(links.action(name, verb))}">'
        f'<button type="submit" class="{verb}">{label}</button></form>'
        for verb, label in (("run", "Run now"), toggle)
    )


_STATES_SAID = {
    "": "any state",
    "failing": "failing",
    "paused": "paused",
    "running": "running",
    "left_alone": "cannot run here",
}


def _filter(query: str, state: str | None, shown: int, matched: int, page: str) -> str:
    """A GET form narrowing the page to the jobs whose name holds a text, in a state."""
    said = f"{matched} match" if query or state else f"showing {shown} of {matched}"
    if (query or state) and shown < matched:
        said += f", showing {shown}"
    options = "".join(
        f'<option value="{value}"{" selected" if value == (state or "") else ""}>{words}</option>'
        for value, words in _STATES_SAID.items()
    )
    return (
        f'<form class="filter" method="get" action="{escape(page)}" role="search">'
        '<label for="q">Jobs whose name holds</label> '
        f'<input id="q" name="q" type="search" value="{escape(query)}" maxlength="200"> '
        f'<label for="state">in</label> <select id="state" name="state">{options}</select> '
        f'<button type="submit">Filter</button> <span class="sub">{said}</span></form>\n'
    )


def _pages(first: str | None, after: str | None) -> str:
    """Links to the first page of the filter (once past it) and to the next."""
    links = []
    if first is not None:
        links.append(f'<a href="{escape(first)}" rel="first">First page</a>')
    if after is not None:
        links.append(f'<a href="{escape(after)}" rel="next">Next page</a>')
    return f'<nav class="pages" aria-label="Pages">{" · ".join(links)}</nav>\n'


def _unknown(schedules: Sequence[tuple[str, str, str]]) -> str:
    """The stored schedules this instance leaves alone, each with why (its task
    missing, arguments its task does not take, a spec it cannot read): never
    silently gone."""
    items = "".join(
        f"<li><code>{escape(name)}</code> (task <code>{escape(task)}</code>)"
        + (f': <span class="sub">{escape(why)}</span>' if why else "")
        + "</li>"
        for name, task, why in schedules[:PAGE_JOBS]
    )
    more = len(schedules) - PAGE_JOBS
    if more > 0:
        items += (
            f'<li class="sub">and {more} more (GET /jobs/schedules?state=left_alone '
            "lists them)</li>"
        )
    return (
        f'<section class="unknown"><h2>Schedules this instance cannot run ({len(schedules)})'
        '</h2><p class="sub">This instance leaves them alone, for the reason given; the '
        "instances that can run them do.</p><ul>" + items + "</ul></section>\n"
    )


def _instances(view: ClusterView, me: str, now: float) -> str:
    rows = []
    for inst in view.instances:
        mark = ' <span class="sub">(this one)</span>' if inst.id == me else ""
        rows.append(
            f"<tr><td><code>{escape(inst.id)}</code>{mark}</td><td>{escape(inst.hostname)}</td>"
            f"<td>{inst.pid}</td><td>{time_tag(inst.started_at, now)}</td>"
            f"<td>{time_tag(inst.seen_at, now)}</td></tr>"
        )
    return (
        f'<section class="instances"><h2>Instances ({len(view.instances)})</h2>'
        '<table><thead><tr><th scope="col">Instance</th><th scope="col">Host</th>'
        '<th scope="col">PID</th><th scope="col">Started</th><th scope="col">Last seen'
        "</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>\n"
    )


def notice_url(page: str, notice: str, job: str) -> str:
    return f"{page}?{urlencode({'notice': notice, 'job': job})}"
