"""What stands before a request reaches a route: the API key and the body size limit.

Both are plain ASGI middlewares, so they act before FastAPI reads or parses a body: a client
without the key, or with a body over the limit, costs the server almost nothing.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mur.endpoint.errors import APIError

OPEN_PATHS = frozenset({"/health"})
"""Paths answered without the key (liveness probes); their replies hold no details then."""


class ApiKey:
    """A bearer API key (like vLLM's `--api-key`), checked in constant time.

    Only a SHA-256 digest of the key is kept: comparing digests of equal length with
    `hmac.compare_digest` reveals neither the key's content nor its length, and no repr or log
    line can hold the key itself.
    """

    def __init__(self, key: str) -> None:
        if not key.strip():
            raise ValueError("the API key is empty: give a non-empty key or none at all")
        self._digest = hashlib.sha256(key.encode()).digest()

    def __repr__(self) -> str:
        return "ApiKey(<hidden>)"

    def admits(self, headers: Headers) -> bool:
        """Whether `Authorization: Bearer <key>` carries this key."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        supplied = hashlib.sha256(token.strip().encode()).digest()
        return hmac.compare_digest(supplied, self._digest) and scheme.lower() == "bearer"


class RequireApiKey:
    """401 for every path but OPEN_PATHS unless the request carries the key."""

    def __init__(self, app: ASGIApp, key: ApiKey) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in OPEN_PATHS
            or scope["method"] == "OPTIONS"
            or self.key.admits(Headers(scope=scope))
        ):
            await self.app(scope, receive, send)
            return
        error = APIError(
            401,
            "missing or wrong API key: send it as the header `Authorization: Bearer KEY` "
            "(the OpenAI client's api_key)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await error.response()(scope, receive, send)


def too_large(limit: int) -> str:
    return f"the request body is over the limit of {limit:,} bytes (--max-request-bytes)"


class LimitBody:
    """413 for a body over `limit` bytes: at once from its Content-Length, else while it is
    read (a chunked body has no length up front)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the request size limit must be >= 1 byte, got {limit}")
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            error = APIError(413, too_large(self.limit), code="request_too_large")
            await error.response()(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # FastAPI passes an HTTPException raised while reading the body on to the
                    # exception handlers (errors.py), which answer it in OpenAI's shape.
                    raise HTTPException(413, too_large(self.limit))
            return message

        await self.app(scope, limited, send)
