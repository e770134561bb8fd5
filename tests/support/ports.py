"""A free TCP port on the loopback, for the servers the tests and the bench start
(PostgreSQL, uvicorn with several workers, the example app): a fixed port is
another run's on a shared machine."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now. It is only free until someone binds it:
    hand it straight to the server that will."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
