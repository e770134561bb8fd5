"""The metrics' families, and the two ways their samples are written down.

The figures are emitted once (``_rows.py``), into one of two sinks:

* ``MetricSink`` makes prometheus_client's ``Metric`` families, for whatever
  renders the registry (``generate_latest``, ``make_asgi_app``, a thread of
  ``start_http_server``);
* ``TextSink`` writes the exposition text itself, for ``Metrics.router()``:
  prometheus_client spends ~5 µs a sample on OpenMetrics (each sample's labels
  sorted, escaped and formatted anew, its version parsed), which at 5,000 jobs
  made a scrape 2.4 s of CPU. Here a job's label is escaped once per scrape and
  a sample is one f-string (~0.5 µs), in slices the event loop can interleave
  with its other work. Its HELP and TYPE lines are prometheus_client's own, and
  a test holds the text byte for byte equal to prometheus_client's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString as _go_untyped

__all__ = [
    "CLUSTER_RUNNING",
    "HAND_OFF",
    "INSTANCES",
    "INTERVAL",
    "JOBS",
    "LAST_RUN",
    "NEXT_RUN",
    "OUTCOME",
    "PAUSED",
    "PER_JOB",
    "READ",
    "RETRIES",
    "RUNNING",
    "RUNS",
    "SCHEDULER_RUNNING",
    "SKIPPED",
    "STORE_UP",
    "SUCCESS",
    "SUMMED",
    "Family",
    "MetricSink",
    "TextSink",
    "header",
]

_CHUNK = 256  # lines encoded together: ~15 KB, ~20 µs
PREFIX = "fastapi_jobs_"

# How both formats write a value ("+Inf", "1.0", "1.5e+09"): prometheus_client's own.
_go: Callable[[float], str] = _go_untyped


class Family:
    """A metric family: its name, type, help and label names (sorted, as both
    formats write them)."""

    __slots__ = ("bucket_labels", "doc", "kind", "labels", "name")

    def __init__(self, name: str, kind: str, doc: str, labels: tuple[str, ...] = ()) -> None:
        if list(labels) != sorted(labels) or "le" in labels:
            raise ValueError(f"{name}: label names sorted, and no 'le': {labels}")
        self.name, self.kind, self.doc, self.labels = name, kind, doc, labels
        # A histogram's buckets carry "le" after the family's labels (sorted:
        # the only label names here sort before it).
        self.bucket_labels = (*labels, "le")
        if kind == "histogram" and any(label > "le" for label in labels):
            raise ValueError(f"{name}: a label sorts after 'le': {labels}")


def _family(name: str, kind: str, doc: str, *labels: str) -> Family:
    return Family(PREFIX + name, kind, doc, labels)


RUNS = _family(
    "runs",
    "counter",
    "Runs (each attempt) that ended in this process, by outcome.",
    "job_name",
    "outcome",
)
SKIPPED = _family(
    "skipped_ticks",
    "counter",
    "Ticks that did not run in this process, by reason.",
    "job_name",
    "reason",
)
RETRIES = _family("retries", "counter", "Retries started in this process.", "job_name")
RUNNING = _family("running", "gauge", "1 while a run of the job goes in this process.", "job_name")
SCHEDULER_RUNNING = _family(
    "scheduler_running", "gauge", "1 if this process's scheduler is running."
)
NEXT_RUN = _family("next_run_timestamp_seconds", "gauge", "The job's next tick.", "job_name")
INTERVAL = _family(
    "interval_seconds",
    "gauge",
    "The time between the job's ticks (for a cron job: from its next tick to the "
    "one after). Alert on time() - last_success > 2 x this.",
    "job_name",
)
SUCCESS = _family(
    "last_success_timestamp_seconds",
    "gauge",
    "When the job's latest successful run ended: across instances for a job "
    "claimed in a store, else in this process; 0 if it ran but no success is on "
    "record.",
    "job_name",
)
PAUSED = _family("paused", "gauge", "1 if the job's ticks are skipped as paused.", "job_name")
HAND_OFF = _family(
    "hand_off",
    "gauge",
    "1 for a hand-off job: its runs enqueue its ticks into this queue.",
    "job_name",
    "queue",
)
STORE_UP = _family(
    "store_up",
    "gauge",
    "1 if the store answered the last reading (figures below are from it).",
)
READ = _family(
    "cluster_read_timestamp_seconds",
    "gauge",
    "When the store was last read (the database's clock).",
)
LAST_RUN = _family(
    "last_run_timestamp_seconds",
    "gauge",
    "When the job's last claimed run ended, on any instance.",
    "job_name",
)
OUTCOME = _family(
    "last_outcome",
    "gauge",
    "1 for the outcome of the job's last claimed run, on any instance.",
    "job_name",
    "outcome",
)
CLUSTER_RUNNING = _family(
    "cluster_running", "gauge", "1 while an instance holds a live lease on the job.", "job_name"
)
INSTANCES = _family("instances", "gauge", "Instances whose heartbeat the store has seen lately.")
JOBS = _family("jobs", "gauge", "The jobs of this process's scheduler, declared and stored.")
PER_JOB = _family(
    "per_job_series",
    "gauge",
    "1 if the figures are written per job; 0 if summed over the jobs (more jobs than "
    "instrument(per_job_limit=)).",
)
# Past per_job_limit: this process's counts summed over the jobs (no job_name).
SUMMED = {
    RUNS: _family(
        "runs",
        "counter",
        "Runs (each attempt) that ended in this process, by outcome, all jobs together.",
        "outcome",
    ),
    SKIPPED: _family(
        "skipped_ticks",
        "counter",
        "Ticks that did not run in this process, by reason, all jobs together.",
        "reason",
    ),
    RETRIES: _family("retries", "counter", "Retries started in this process, all jobs together."),
    RUNNING: _family("running", "gauge", "Runs going in this process, all jobs together."),
}


class MetricSink:
    """Samples into prometheus_client's ``Metric`` families, in the families' order."""

    def __init__(self, families: Iterable[Family]) -> None:
        self.metrics = {family: Metric(family.name, family.doc, family.kind) for family in families}

    def add(self, family: Family, suffix: str, labels: tuple[str, ...], value: float) -> None:
        names = family.bucket_labels if suffix == "_bucket" else family.labels
        metric = self.metrics[family]
        metric.add_sample(family.name + suffix, dict(zip(names, labels, strict=True)), value)


class TextSink:
    """Samples as exposition lines, a list per family, encoded a few hundred at
    a time (a join or an encoding of megabytes at once would hold the event
    loop); ``chunks()`` puts each family's lines under its HELP and TYPE."""

    def __init__(self, families: Iterable[Family], headers: Callable[[Family], str]) -> None:
        self._lines: dict[Family, list[str]] = {family: [] for family in families}
        self._chunks: dict[Family, list[bytes]] = {
            family: [headers(family).encode()] for family in self._lines
        }
        self._fragments: dict[tuple[str, str], str] = {}  # (label, value) -> label="escaped"
        self._values: dict[float, str] = {}  # most values repeat: 0, 1, the next tick

    def add(self, family: Family, suffix: str, labels: tuple[str, ...], value: float) -> None:
        shown = self._values.get(value)
        if shown is None:
            shown = self._values[value] = _go(value)
        if labels:
            names = family.bucket_labels if suffix == "_bucket" else family.labels
            fragments = self._fragments
            block = ""
            for pair in zip(names, labels, strict=True):
                fragment = fragments.get(pair)
                if fragment is None:
                    name, label = pair
                    escaped = label.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
                    fragment = fragments[pair] = f'{name}="{escaped}"'
                block = f"{block},{fragment}" if block else fragment
            line = f"{family.name}{suffix}{{{block}}} {shown}\n"
        else:
            line = f"{family.name}{suffix} {shown}\n"
        lines = self._lines[family]
        lines.append(line)
        if len(lines) >= _CHUNK:
            self._chunks[family].append("".join(lines).encode())
            lines.clear()

    def chunks(self) -> list[bytes]:
        """The text, in order, as pieces of a few kilobytes."""
        for family, lines in self._lines.items():
            self._chunks[family].append("".join(lines).encode())
            lines.clear()
        return [chunk for chunks in self._chunks.values() for chunk in chunks]


def header(family: Family, encoder: Callable[[CollectorRegistry], bytes]) -> str:
    """A family's HELP and TYPE lines as ``encoder`` writes them (one, empty)."""
    text = encoder(_Alone(Metric(family.name, family.doc, family.kind))).decode()  # type: ignore[arg-type]
    return text.removesuffix("# EOF\n")


class _Alone:
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]
