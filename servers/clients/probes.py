"""Where a server is and whether it answers: URL forms and the HTTP probes every entry point
uses before it sends work (so a wrong address fails in seconds with one line saying what to do).
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx

from mur.servers.clients.errors import ServerError, ServerUnavailable


def root_url(base_url: str) -> str:
    """`http://h:p/v1` -> `http://h:p`: the server root, where /health and /metrics live."""
    parts = urlsplit(base_url.rstrip("/"))
    path = parts.path.removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


def check_single_url(url: str | None, what: str = "the server URL") -> None:
    """One URL per model: replicas are spread by a router in front of them, not client-side."""
    if url and "," in url:
        raise ServerError(
            f"{what} takes one URL, got {url!r}: to spread questions over replicas, start them "
            "behind vllm-router with `mur servers up --replicas N` (or run your own "
            "vllm-router) and pass the router's URL"
        )


def normalize_base_url(base_url: str) -> str:
    """Accept `http://h:p`, `http://h:p/`, `http://h:p/v1`; return the `/v1` form.

    A URL with some other path is kept as given (a proxy may mount the API elsewhere).
    """
    check_single_url(base_url)
    url = base_url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        url += "/v1"
    return url


def healthy(root: str, timeout: float = 2.0) -> bool:
    """GET <root>/health answers 200 (vLLM's readiness probe)."""
    try:
        return httpx.get(f"{root}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


EMBEDDED_HINT = "start one with `mur servers up` or pass --base-url"


def check_endpoint(base_url: str, timeout: float = 5, hint: str = EMBEDDED_HINT) -> list[str]:
    """Model ids served at `base_url` (GET /v1/models), or ServerUnavailable saying what to do.

    `hint` is the what-to-do part of the message (the default points at the embedded server).
    """
    url = normalize_base_url(base_url)
    try:
        resp = httpx.get(f"{url}/models", timeout=timeout)
    except httpx.TimeoutException:
        raise ServerUnavailable(
            f"the server at {url} did not answer within {timeout:g} s: it may still be "
            f"starting, or {hint}"
        ) from None
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise ServerUnavailable(f"no vLLM server at {url} ({reason}): {hint}") from None
    if resp.status_code != 200:
        raise ServerUnavailable(
            f"{url}/models answered HTTP {resp.status_code}, not a model list: is this a vLLM "
            f"server? {hint}"
        )
    try:
        data = resp.json()["data"]
        return [str(item["id"]) for item in data]
    except (ValueError, KeyError, TypeError):
        raise ServerUnavailable(
            f"{url}/models did not return an OpenAI model list: is this a vLLM server? {hint}"
        ) from None


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
