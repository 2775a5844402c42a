"""benchmarks.scaleout: the numbers it reports come from the servers' counters as stated."""

from __future__ import annotations

import pytest

from benchmarks.scaleout import ONE, Phase, fill_from_counters, main, table
from servers.metrics import (
    GENERATION_TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    REQUESTS_DONE,
)


def snapshot(generated: float, queried: float, hits: float, done: float) -> dict[str, float]:
    return {
        GENERATION_TOKENS: generated,
        PREFIX_CACHE_QUERIES: queried,
        PREFIX_CACHE_HITS: hits,
        REQUESTS_DONE: done,
    }


def test_hit_rate_and_requests_are_deltas_summed_over_replicas() -> None:
    phase = Phase("consistent_hash", "0 + 1", wall_s=10.0, finished=4, graph_tokens=500)
    before = [snapshot(100, 1000, 100, 5), snapshot(0, 0, 0, 0)]
    after = [snapshot(400, 3000, 1600, 25), snapshot(200, 1000, 500, 12)]
    fill_from_counters(phase, before, after)
    assert phase.server_tokens == 500
    assert (phase.queried_tokens, phase.cached_tokens) == (3000, 2000)
    assert phase.hit_rate == pytest.approx(2000 / 3000)
    assert phase.requests == [20, 12] and phase.tokens_per_s == 50.0


def test_table_states_the_ratios() -> None:
    one = Phase(ONE, "0-1", wall_s=10, finished=4, graph_tokens=400)
    one.queried_tokens, one.cached_tokens = 1000, 700
    sticky = Phase("consistent_hash", "0 + 1", wall_s=20, finished=4, graph_tokens=400)
    sticky.queried_tokens, sticky.cached_tokens = 1000, 600
    spread = Phase("round_robin", "0 + 1", wall_s=25, finished=4, graph_tokens=400)
    spread.queried_tokens, spread.cached_tokens = 1000, 300
    text = table([one, sticky, spread])
    assert "| 2 replicas, consistent_hash + session header | 0 + 1 | 4 |" in text
    assert "| 60.0% | 600 / 1,000 |" in text
    assert "Hit rate consistent_hash / round_robin: **2.00x** (60.0% vs 30.0%)" in text
    assert "Throughput consistent_hash / one server: 0.50x tok/s." in text


def test_unknown_policy_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policies", "consistent_hash,sticky"]) == 2
    assert "policies must be among" in capsys.readouterr().err
