"""A TCP proxy in the test's event loop that can cut the link, as a network
partition does: the bytes sent either way vanish, and the connections stay open
(a client learns of it only by its own deadlines). Healed, the connections that
were cut are closed (their streams lost bytes), and new ones go through."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Partition:
    """Forwards 127.0.0.1:``port`` to ``target_port``; `cut` and `heal` the link."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.is_cut = False
        self._healed = asyncio.Event()
        self._healed.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def cut(self) -> None:
        self.is_cut = True
        self._healed.clear()

    def heal(self) -> None:
        self.is_cut = False
        self._healed.set()
        for writer in list(self._writers):
            writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if self.is_cut:
                    continue  # lost on the way
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._healed.wait()  # a connection made during the partition hangs
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        for pipe in (self._pipe(reader, up_writer), self._pipe(up_reader, writer)):
            task = asyncio.get_running_loop().create_task(pipe)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Partition]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            async with server:
                yield self
        finally:
            for writer in list(self._writers):
                writer.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
