"""The MUR graph through the replica router against the real CPU vLLM server.

One server listed twice is two routing slots: enough to see real replies (logprobs, usage) pass
through the router unchanged and both slots used, without starting a second server.
"""

from __future__ import annotations

import asyncio

import pytest

from graphs.mur import build_graph
from graphs.state import Context, output_of
from servers.router import RoutedChatModel, make_routed_model

pytestmark = pytest.mark.integration

QUESTIONS = ["If 2x + 3 = 11, what is x?", "What is 12 * 7?"]
TINY = Context(gate="always", max_steps=2, max_step_tokens=48, judge_max_tokens=32)


async def test_mur_graph_runs_over_two_routed_slots(cpu_server) -> None:
    routed = make_routed_model([cpu_server.base_url, cpu_server.base_url])
    assert isinstance(routed, RoutedChatModel) and routed.model_name == cpu_server.model
    graph = build_graph("critic", backbone=routed)
    finals = await asyncio.gather(
        *(graph.ainvoke({"question": q}, context=TINY) for q in QUESTIONS)
    )
    results = [output_of(final) for final in finals]
    for result in results:
        assert result["steps"], result
        for step in result["steps"]:
            assert step["num_tokens"] > 0 and step["scaled"]  # gate "always" refines each
    first, second = routed.served
    assert first > 0 and second > 0, routed.served
    assert routed.in_flight == [0, 0]
    # Every request the graph counted went through exactly one slot.
    assert sum(r["usage"]["llm_calls"] for r in results) == first + second
