"""vLLM's Prometheus counters, as the benchmark reads them: snapshots, differences, ratios."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

from mur.servers.clients.metrics import samples

# vLLM's Prometheus counters the benchmark reads (sums over label sets).
COUNTERS: dict[str, str] = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "cache_queries": "vllm:prefix_cache_queries_total",
    "cache_hits": "vllm:prefix_cache_hits_total",
    "step_tokens": "vllm:iteration_tokens_total_sum",
    "steps": "vllm:iteration_tokens_total_count",
    "itl_sum": "vllm:inter_token_latency_seconds_sum",
    "itl_count": "vllm:inter_token_latency_seconds_count",
    "e2e_sum": "vllm:e2e_request_latency_seconds_sum",
    "e2e_count": "vllm:e2e_request_latency_seconds_count",
    "queue_sum": "vllm:request_queue_time_seconds_sum",
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


@dataclass(frozen=True)
class Counters:
    """A snapshot (or a difference of two) of the server's counters; None = not exposed."""

    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    cache_queries: float | None = None
    cache_hits: float | None = None
    step_tokens: float | None = None
    steps: float | None = None
    itl_sum: float | None = None
    itl_count: float | None = None
    e2e_sum: float | None = None
    e2e_count: float | None = None
    queue_sum: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None

    def __sub__(self, other: Counters) -> Counters:
        values = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            values[f.name] = None if a is None or b is None else a - b
        return Counters(**values)

    @property
    def hit_rate(self) -> float | None:
        """Prefix-cache hits / queries (tokens)."""
        return ratio(self.cache_hits, self.cache_queries)

    @property
    def inter_token_s(self) -> float | None:
        """Mean time between two tokens of a request: how fast the server was stepping."""
        return ratio(self.itl_sum, self.itl_count)

    @property
    def sequences_per_step(self) -> float | None:
        """Generated tokens per engine step: the mean number of sequences decoding together,
        i.e. how full the batch was, whatever the server's speed."""
        return ratio(self.generation_tokens, self.steps)

    @property
    def tokens_per_step(self) -> float | None:
        """Mean tokens per engine step (prefill + decode): how full the batch was."""
        return ratio(self.step_tokens, self.steps)


def parse_counters(text: str) -> Counters:
    """The counters of `COUNTERS` from a Prometheus /metrics text (parsed once)."""
    wanted = {name: key for key, name in COUNTERS.items()}
    values: dict[str, float] = {}
    for sample in samples(text):
        key = wanted.get(sample.name)
        if key is not None:
            values[key] = values.get(key, 0.0) + sample.value
    return Counters(**values)


def add_counters(a: Counters, b: Counters) -> Counters:
    """Field-wise sum (None when either side lacks the counter)."""
    values = {}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        values[f.name] = None if x is None or y is None else x + y
    return Counters(**values)


def parse_block_size(text: str) -> int | None:
    """The KV-cache block size from vLLM's `cache_config_info` (prefix hits are whole blocks)."""
    for sample in samples(text):
        if sample.name == "vllm:cache_config_info" and "block_size" in sample.labels:
            with contextlib.suppress(ValueError):
                return int(sample.labels["block_size"])
    return None
