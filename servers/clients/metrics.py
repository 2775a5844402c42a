"""Read vLLM's Prometheus counters: an independent check of client-side token accounting.

vLLM's `vllm:generation_tokens_total` on `/metrics` moves by exactly the sum of
`usage.completion_tokens` over the requests it served (checked with n = 1..3, stop strings and
length cut-offs), so a benchmark can compare its own token count with the server's:

    before = generation_tokens(base_url)
    ...  # run the graph
    spent = generation_tokens(base_url) - before

The counter is server-wide: other clients of the same server during the window are counted too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from mur.servers.clients.errors import ServerUnavailable
from mur.servers.clients.probes import normalize_base_url, root_url

GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
"""Prompt tokens looked up in the prefix cache (vLLM 0.32; checked on a live server)."""
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
"""Of those, tokens found cached (their KV was reused, not recomputed)."""
REQUESTS_DONE = "vllm:request_success_total"


def samples(text: str) -> Iterator[Sample]:
    """Every sample of a Prometheus text exposition (`/metrics`), parsed by prometheus_client."""
    for family in text_string_to_metric_families(text):
        yield from family.samples


def parse_counter(text: str, name: str) -> float | None:
    """Sum of all samples named `name` (over every label set) in Prometheus text format.

    `name` is the sample's full name (`vllm:generation_tokens_total`, `..._sum`, `..._count`).
    Returns None when the metric is absent.
    """
    values = [sample.value for sample in samples(text) if sample.name == name]
    return sum(values) if values else None


def read_counter(base_url: str, name: str, timeout: float = 5) -> float:
    """Current value of counter `name` on the server at `base_url` (/v1 suffix optional)."""
    root = root_url(normalize_base_url(base_url))
    try:
        resp = httpx.get(f"{root}/metrics", timeout=timeout)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise ServerUnavailable(
            f"cannot read {root}/metrics ({exc.__class__.__name__}): is a vLLM server running "
            "there? start one with `mur servers up` or pass --base-url"
        ) from None
    value = parse_counter(resp.text, name)
    if value is None:
        raise ServerUnavailable(
            f"{root}/metrics has no {name}: this server is not vLLM, or a vLLM version that "
            "names its metrics differently"
        )
    return value


def generation_tokens(base_url: str, timeout: float = 5) -> int:
    """Total tokens the server has generated since it started (`vllm:generation_tokens_total`)."""
    return int(read_counter(base_url, GENERATION_TOKENS, timeout))


def prompt_tokens(base_url: str, timeout: float = 5) -> int:
    """Total prompt tokens the server has processed since it started."""
    return int(read_counter(base_url, PROMPT_TOKENS, timeout))


def settled(read: Callable[[], int], quiet: float = 2.0, timeout: float = 60) -> int:
    """The value of `read()` (a counter other requests, or the server's own bookkeeping, may
    still be moving) once it has not moved for `quiet` seconds; TimeoutError after `timeout`."""
    value, since, deadline = read(), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() - since < quiet:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the counter was still moving after {timeout} s")
        time.sleep(0.25)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value
