"""vLLM's Prometheus counters, as the benchmark reads them: snapshots, differences, ratios."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from mur.servers.clients.metrics import samples


def counter(metric: str) -> Any:
    """A field of `Counters`: the sum of vLLM's Prometheus `metric` over its label sets."""
    return field(default=None, metadata={"metric": metric})


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


@dataclass(frozen=True)
class Counters:
    """A snapshot (or a difference of two) of the server's counters; None = not exposed."""

    generation_tokens: float | None = counter("vllm:generation_tokens_total")
    prompt_tokens: float | None = counter("vllm:prompt_tokens_total")
    cache_queries: float | None = counter("vllm:prefix_cache_queries_total")
    cache_hits: float | None = counter("vllm:prefix_cache_hits_total")
    step_tokens: float | None = counter("vllm:iteration_tokens_total_sum")
    steps: float | None = counter("vllm:iteration_tokens_total_count")
    itl_sum: float | None = counter("vllm:inter_token_latency_seconds_sum")
    itl_count: float | None = counter("vllm:inter_token_latency_seconds_count")
    requests_running: float | None = counter("vllm:num_requests_running")
    requests_waiting: float | None = counter("vllm:num_requests_waiting")

    def __sub__(self, other: Counters) -> Counters:
        return fieldwise(operator.sub, self, other)

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
    """The `Counters` from a Prometheus /metrics text (parsed once)."""
    wanted = {f.metadata["metric"]: f.name for f in fields(Counters)}
    values: dict[str, float] = {}
    for sample in samples(text):
        key = wanted.get(sample.name)
        if key is not None:
            values[key] = values.get(key, 0.0) + sample.value
    return Counters(**values)


def fieldwise(op: Callable[[float, float], float], a: Counters, b: Counters) -> Counters:
    """`op` of a's and b's counters, field by field (None when either side lacks one)."""
    values = {}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        values[f.name] = None if x is None or y is None else op(x, y)
    return Counters(**values)


def add_counters(a: Counters, b: Counters) -> Counters:
    return fieldwise(operator.add, a, b)


def parse_block_size(text: str) -> int | None:
    """The KV-cache block size from vLLM's `cache_config_info` (prefix hits are whole blocks)."""
    for sample in samples(text):
        if sample.name == "vllm:cache_config_info" and "block_size" in sample.labels:
            with contextlib.suppress(ValueError):
                return int(sample.labels["block_size"])
    return None
