"""Serve an ASGI app (the MUR endpoint) with a real uvicorn in a background thread, its
lifespan run (the endpoint opens its checkpointer there)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


@contextlib.contextmanager
def running(app: Any, host: str = "127.0.0.1", timeout: float = 10) -> Iterator[str]:
    """Serve `app` on a free port of `host`; yields its base URL (`http://HOST:PORT/v1`).

    The socket is bound here, so there is no race for the port.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="asgi-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the app did not start on {host}:{port}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
