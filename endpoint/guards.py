"""What stands before a request reaches a route: the API key and the body size limit.

Both are plain ASGI middlewares, so they act before FastAPI reads or parses a body: a client
without the key, or with a body over the limit, costs the server almost nothing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mur.endpoint.errors import APIError
from mur.endpoint.idempotency import CALLER_STATE

OPEN_PATHS = frozenset({"/health"})
"""Paths answered without the key (liveness probes); their replies hold no details then."""


class ApiKey:
    """The endpoint's bearer API keys (one or several, like vLLM's `--api-key`), checked in
    constant time.

    Only a SHA-256 digest of each key is kept: comparing digests of equal length with
    `hmac.compare_digest`, against every key whichever matches, reveals neither a key's
    content nor its length nor which key matched, and no repr or log line can hold a key.
    The matching key names the caller (`caller`), to whom idempotency keys are scoped.
    """

    def __init__(self, keys: str | Sequence[str]) -> None:
        listed = [keys] if isinstance(keys, str) else list(keys)
        if not listed or any(not key.strip() for key in listed):
            raise ValueError("an API key is empty: give non-empty keys or none at all")
        self._digests = [hashlib.sha256(key.encode()).digest() for key in listed]

    def __repr__(self) -> str:
        return f"ApiKey(<{len(self._digests)} hidden>)"

    def caller(self, headers: Headers) -> str | None:
        """The id of the caller whose key `Authorization: Bearer <key>` carries (a digest of
        that key's digest), or None when it carries none of the keys."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        supplied = hashlib.sha256(token.strip().encode()).digest()
        matched = None
        for digest in self._digests:
            if hmac.compare_digest(supplied, digest):
                matched = digest
        if matched is None or scheme.lower() != "bearer":
            return None
        return hashlib.sha256(b"mur-caller\x00" + matched).hexdigest()[:32]

    def admits(self, headers: Headers) -> bool:
        """Whether `Authorization: Bearer <key>` carries one of the keys."""
        return self.caller(headers) is not None


def api_keys(flags: Sequence[str] | None, variable: str | None) -> list[str] | None:
    """The keys of repeated `--api-key` flags, else of the variable (comma-separated); None:
    an open endpoint."""
    keys = list(flags) if flags else [k.strip() for k in (variable or "").split(",") if k.strip()]
    return keys or None


class RequireApiKey:
    """401 for every path but OPEN_PATHS unless the request carries the key."""

    def __init__(self, app: ASGIApp, key: ApiKey) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        caller = self.key.caller(Headers(scope=scope))
        if caller is not None:
            scope = {**scope, "state": {**(scope.get("state") or {}), CALLER_STATE: caller}}
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
