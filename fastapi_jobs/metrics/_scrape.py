"""Serving a Prometheus scrape without holding the event loop.

prometheus_client's ``make_asgi_app`` renders the whole registry in one go on
the loop: with 5,000 jobs, 16 MB and 2.4 s of CPU (OpenMetrics, which
Prometheus asks for first), during which no request was answered. Here the
scheduler's figures are written by ``Metrics._text()``, which lets the loop run
every millisecond; the rest of the registry (the process's, the app's own
metrics) is rendered by prometheus_client, and gzip runs in a worker thread
(zlib lets go of the GIL). Not the whole rendering in a thread: a thread
holding the GIL makes each turn of a busy event loop wait for the GIL's switch
interval (5 ms), and with 5,000 jobs ticking that made requests wait seconds
(docs/development/benchmark-notes.md). A rendering is served again to every scrape within
``max_age`` of it, and scrapes that come while one is made wait for it.

In prometheus_client's multiprocess mode, the files of workers that have ended
without ``mark_process_dead`` (SIGKILLed, OOM-killed) are marked dead before
each rendering here and when a worker starts, so a dead worker's ``running``
does not stay up.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import zlib
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.exposition import choose_encoder

__all__ = ["Exposition", "forget_dead_processes"]

# The files prometheus_client keeps per process for its "live" gauge modes
# (what mark_process_dead removes); the other files are sums, kept on purpose.
_LIVE_FILE = re.compile(r"gauge_live(?:all|sum|max|min|mostrecent)_(\d+)\.db")
# gzip's fastest level: on this text 7 ms against level 9's 47 ms (5,000 jobs), 1.1x the bytes.
_GZIP_LEVEL = 1


Render = Callable[[Callable[[CollectorRegistry], bytes], str], Awaitable[list[bytes]]]


class Exposition:
    """The endpoint of ``Metrics.router()``: ``render(encoder, content_type)``'s pieces,
    joined (or gzipped) in a worker thread and served again for ``max_age``."""

    def __init__(self, render: Render, max_age: float, multiprocess: bool) -> None:
        self.render, self.max_age, self.multiprocess = render, max_age, multiprocess
        # (content type, gzipped) -> (monotonic time its rendering began, body)
        self._made: dict[tuple[str, bool], tuple[float, bytes]] = {}
        self._making: dict[tuple[str, bool], _Making] = {}

    async def answer(self, accept: str, accept_encoding: str) -> tuple[bytes, str, bool]:
        """For a scrape's Accept and Accept-Encoding: the body, its content type,
        and whether it is gzipped."""
        encoder, content_type = choose_encoder(accept)
        gzipped = "gzip" in accept_encoding
        return await self.body(encoder, content_type, gzipped), content_type, gzipped

    async def body(
        self, encoder: Callable[[CollectorRegistry], bytes], content_type: str, gzipped: bool
    ) -> bytes:
        """What ``encoder`` writes, from a rendering younger than ``max_age`` if
        there is one (or one under way)."""
        key = (content_type, gzipped)
        made = self._made.get(key)
        if made is not None and time.monotonic() - made[0] < self.max_age:
            return made[1]
        making = self._making.get(key)
        if making is not None:
            await making.done.wait()
            if making.body is not None:
                return making.body
            # It failed (its scrape has the error): this one makes its own.
        self._making[key] = making = _Making()
        try:
            began = time.monotonic()
            if self.multiprocess:
                await anyio.to_thread.run_sync(forget_dead_processes)
            chunks = await self.render(encoder, content_type)
            # zlib lets go of the GIL as it compresses: the loop runs on meanwhile.
            body = await anyio.to_thread.run_sync(_gzip if gzipped else b"".join, chunks)
            # Keep only what is fresh: a format no scraper asks for any more goes.
            self._made = {k: v for k, v in self._made.items() if began - v[0] < self.max_age}
            self._made[key] = (began, body)
            making.body = body
        finally:
            if self._making.get(key) is making:
                del self._making[key]
            making.done.set()
        return body


class _Making:
    """A rendering under way, which the scrapes that come meanwhile wait for."""

    __slots__ = ("body", "done")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.body: bytes | None = None


def _gzip(chunks: list[bytes]) -> bytes:
    packer = zlib.compressobj(_GZIP_LEVEL, wbits=31)  # 31: a gzip stream
    return b"".join([*map(packer.compress, chunks), packer.flush()])


def forget_dead_processes() -> list[int]:
    """``mark_process_dead`` for each process whose live gauges are in
    ``PROMETHEUS_MULTIPROC_DIR`` but which has ended; returns their pids."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return []
    try:
        names = os.listdir(directory)
    except OSError:
        return []  # prometheus_client's own collector says what is wrong with it
    pids = {int(found[1]) for name in names if (found := _LIVE_FILE.fullmatch(name))}
    dead = sorted(pid for pid in pids if not _alive(pid))
    for pid in dead:
        with contextlib.suppress(FileNotFoundError):  # another worker removed it first
            multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    return dead


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if _PROC:
        try:
            # A killed worker is a zombie until its parent reaps it: it has ended.
            with open(f"/proc/{pid}/stat", "rb") as stat:
                return stat.read().rpartition(b")")[2].split()[0] != b"Z"
        except FileNotFoundError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


_PROC = os.path.exists("/proc/self/stat")  # Linux: a process's state can be read
