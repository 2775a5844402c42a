"""The MUR graph against the real CPU vLLM server: exact uncertainty, decisions and tokens."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from graphs import STRATEGIES, Context
from graphs.mur import build_graph
from graphs.solve import solve
from nodes.gates import replay_decisions
from nodes.uncertainty import step_uncertainty
from servers import generation_tokens
from servers.connect import connect

pytestmark = pytest.mark.integration

QUESTIONS = [
    "A store sells pencils at 3 for $1. How much do 24 pencils cost?",
    "What is the sum of the first 10 positive odd numbers?",
    "If 2x + 3 = 11, what is x?",
]
# Small enough for two CPU cores, large enough for several steps and every mechanism.
TINY = {"max_steps": 4, "max_step_tokens": 48, "judge_max_tokens": 32, "thinking_budget": 32}


@pytest.fixture(scope="module")
def backbone(cpu_server):
    return connect(base_url=cpu_server.base_url, model=cpu_server.model).backbone


async def solve_all(graph, context: Context) -> list[tuple[dict, list[dict]]]:
    solutions = await asyncio.gather(*(solve(graph, q, context=context) for q in QUESTIONS))
    return [(solution.output, solution.steps) for solution in solutions]


def check_trace(result: dict[str, Any], events: list[dict[str, Any]], context: Context) -> None:
    steps = result["steps"]
    assert [e["index"] for e in events] == [s["index"] for s in steps]
    for step, event in zip(steps, events, strict=True):
        # The uncertainty recomputes from the kept step's own token logprobs.
        assert len(event["logprobs"]) == step["num_tokens"] > 0
        assert step["uncertainty"] == pytest.approx(step_uncertainty(event["logprobs"]))
    drafts = [e["draft_uncertainty"] if e["scaled"] else None for e in events]
    replayed = replay_decisions(
        context.gate,
        [s["uncertainty"] for s in steps],
        gamma=context.gamma,
        alpha=context.alpha,
        draft_uncertainties=drafts,
    )
    assert replayed == [s["scaled"] for s in steps]


async def solve_and_check(server, graph, context: Context) -> list[tuple[dict, list[dict]]]:
    """Solve every question; the usage must equal what the server generated, and every
    trace must recompute and replay exactly."""
    before = generation_tokens(server.base_url)
    results = await solve_all(graph, context)
    generated = generation_tokens(server.base_url) - before
    counted = sum(r["usage"]["backbone_tokens"] + r["usage"]["external_tokens"] for r, _ in results)
    assert counted == generated
    for result, events in results:
        check_trace(result, events, context)
    return results


@pytest.mark.parametrize("gate", ["mur", "always", "never"])
async def test_critic_graph_is_exact_against_the_server(cpu_server, backbone, gate) -> None:
    context = Context(gate=gate, **TINY)
    graph = build_graph(backbone=backbone)
    results = await solve_and_check(cpu_server, graph, context)
    for result, _ in results:
        if gate == "always":
            assert all(s["scaled"] for s in result["steps"])
        if gate == "never":
            assert result["usage"]["external_tokens"] == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("gate", ["always", "mur"])
async def test_every_strategy_counts_every_token(cpu_server, backbone, strategy, gate) -> None:
    context = Context(strategy=strategy, gate=gate, gamma=1.2, num_candidates=3, **TINY)
    graph = build_graph(backbone=backbone)
    results = await solve_and_check(cpu_server, graph, context)
    for result, _ in results:
        for step in result["steps"]:
            if step["scaled"]:
                assert step["refine"]["strategy"] == strategy
                assert step["strategy"] == strategy
    if gate == "always":
        assert all(s["refine"] for r, _ in results for s in r["steps"])
