"""Keep-alive connections for the openai SDK, one pool per event loop.

A pooled connection belongs to the event loop that opened it: reused from a later loop (a
second `asyncio.run()`, as the CLI, the tests and Studio's graph each make) it fails with
"Event loop is closed". Opening a connection per request avoids that, but costs a TCP connect
and close each time, a large share of the client's CPU once the server answers as fast as a
GPU does (`mur bench client`). So the transport keeps one pool per running loop: a loop's
requests reuse its connections, and the pool is closed when its loop ends, by the same
shutdown that closes the loop's async generators (`asyncio.run` and uvicorn both run it).

Idle connections are dropped after `KEEPALIVE_EXPIRY_S`, well before the 5 s after which
vLLM's API server (uvicorn) closes them itself: a request sent on a connection the server is
closing at that moment would be lost as a reset.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

import openai

KEEPALIVE_EXPIRY_S = 2.0
MAX_CONNECTIONS = 1000


@cache
def sdk_http_module() -> ModuleType:
    """The SDK's HTTP library (httpx, or httpx2 in newer SDKs), whose classes it accepts."""
    client_cls = openai.DefaultAsyncHttpxClient
    base = next(c for c in client_cls.__mro__ if c.__name__ == "AsyncClient")
    return importlib.import_module(base.__module__.split(".")[0])


@dataclass(frozen=True)
class _LoopPool:
    """One event loop's connection pool, and the suspended generator that closes it."""

    transport: Any
    closer: AsyncIterator[None]


class LoopPools:
    """A transport that sends each request through a connection pool of its event loop (the
    HTTP client asks a transport for `handle_async_request` and `aclose` only)."""

    def __init__(self, http: ModuleType) -> None:
        self._http = http
        self._pools: dict[asyncio.AbstractEventLoop, _LoopPool] = {}

    async def _pool(self) -> Any:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for old in [old for old in self._pools if old.is_closed()]:
                del self._pools[old]  # ended without its shutdown
            limits = self._http.Limits(
                max_connections=MAX_CONNECTIONS,
                max_keepalive_connections=MAX_CONNECTIONS,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            )
            transport = self._http.AsyncHTTPTransport(limits=limits)
            pool = _LoopPool(transport, _close_at_shutdown(transport, self._pools, loop))
            self._pools[loop] = pool
            await anext(pool.closer)  # now suspended: the loop's shutdown resumes and closes it
        return pool.transport

    @property
    def open_pools(self) -> int:
        """Event loops with a pool open (a loop's shutdown closes its own)."""
        return len(self._pools)

    async def handle_async_request(self, request: Any) -> Any:
        transport = await self._pool()
        return await transport.handle_async_request(request)

    async def aclose(self) -> None:
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.transport.aclose()

    async def __aenter__(self) -> LoopPools:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _close_at_shutdown(
    transport: Any,
    pools: dict[asyncio.AbstractEventLoop, _LoopPool],
    loop: asyncio.AbstractEventLoop,
) -> AsyncIterator[None]:
    """Suspended for the loop's life; `loop.shutdown_asyncgens()` ends it, closing the pool."""
    try:
        yield
    finally:
        if loop in pools and pools[loop].transport is transport:
            del pools[loop]
        await transport.aclose()


def pooled_async_http_client() -> Any:
    """An async HTTP client for the openai SDK with keep-alive connections per event loop."""
    transport = LoopPools(sdk_http_module())
    return openai.DefaultAsyncHttpxClient(transport=transport)  # type: ignore[arg-type]
