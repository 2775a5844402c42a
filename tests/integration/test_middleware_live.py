"""MURMiddleware in LangChain's create_agent on the suite's cpu-tiny server (SmolLM2-135M, the
session's `cpu_server`): the agent's model is a plain ChatOpenAI, asked for logprobs by the
middleware alone. A run of three model calls sees every call's uncertainty and momentum in its
message, the gate's decisions replay with MUR's own function, the calls after the first are
escalated (to a ChatOpenAI at temperature 0 on the same server) or voted on, and the tokens in
the messages, in the run's state and in LangChain's meter equal the server's own counter.
About 150 generated tokens in all (16 per call)."""

from __future__ import annotations

import math
from functools import partial
from itertools import pairwise
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, AgentState, hook_config
from langchain_core.callbacks import UsageMetadataCallbackHandler, get_usage_metadata_callback
from langchain_core.messages import AIMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.runtime import Runtime
from server_counters import settled

from mur import MURMiddleware
from mur.nodes.gates import replay_decisions
from mur.nodes.uncertainty import update_momentum
from mur.servers import generation_tokens
from mur.servers.processes.launcher import RunningServer

pytestmark = pytest.mark.integration

GAMMA = 1e4
"""So large (the threshold M - 9.2 nats) that the gate flags every call after the first: the
test is of what the middleware does with a flagged call, not of the tiny model's numbers."""
CALLS = 3


class GoOn(AgentMiddleware[AgentState[Any], Any, Any]):
    """Asks the model again ("Go on.") until it has replied CALLS times in the run: cpu-tiny
    serves no tool calls, so this is how a run without tools makes several model calls."""

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        replies = sum(isinstance(message, AIMessage) for message in state["messages"])
        if replies >= CALLS:
            return None
        return {"messages": [HumanMessage("Go on.")], "jump_to": "model"}

    @hook_config(can_jump_to=["model"])
    async def aafter_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self.after_model(state, runtime)


def chat(server: RunningServer, **settings: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.base_url, model=server.model, api_key="EMPTY", max_tokens=16, **settings
    )


async def run(
    server: RunningServer, middleware: MURMiddleware
) -> tuple[dict[str, Any], int, UsageMetadataCallbackHandler]:
    """The agent's state after one run, the tokens the server generated for it, the meter."""
    agent = create_agent(chat(server, temperature=1.0), tools=[], middleware=[middleware, GoOn()])
    counter = partial(settled, partial(generation_tokens, server.base_url))
    before = counter()
    with get_usage_metadata_callback() as meter:
        state = await agent.ainvoke({"messages": [("user", "Name three colours.")]})
    return state, counter() - before, meter


def check_every_call(
    state: dict[str, Any], generated: int, meter: UsageMetadataCallbackHandler, action: str
) -> list[dict[str, Any]]:
    replies = [m for m in state["messages"] if isinstance(m, AIMessage)]
    done = [message.response_metadata["mur"] for message in replies]
    assert [r["call"] for r in done] == list(range(1, CALLS + 1))
    assert [r["action"] for r in done] == ["kept"] + [action] * (CALLS - 1)
    for record in done:
        assert math.isfinite(record["uncertainty"]) and record["uncertainty"] > 0
        after = update_momentum(record["momentum_before"], record["kept_uncertainty"], 0.9)
        assert record["momentum_after"] == pytest.approx(after)
    for earlier, later in pairwise(done):
        assert later["momentum_before"] == earlier["momentum_after"]
    assert state["mur_momentum"] == done[-1]["momentum_after"]
    assert [r["flagged"] for r in done] == replay_decisions(
        "mur",
        [r["kept_uncertainty"] for r in done],
        gamma=GAMMA,
        draft_uncertainties=[r["uncertainty"] for r in done],
    )
    in_messages = sum(m.usage_metadata["output_tokens"] for m in replies if m.usage_metadata)
    assert in_messages == state["mur_tokens"] == generated
    assert sum(usage["output_tokens"] for usage in meter.usage_metadata.values()) == generated
    return done


async def test_uncertain_calls_are_escalated_and_every_call_is_measured(
    cpu_server: RunningServer,
) -> None:
    stronger = chat(cpu_server, temperature=0.0, logprobs=True)
    state, generated, meter = await run(
        cpu_server, MURMiddleware(escalate_to=stronger, gamma=GAMMA)
    )
    done = check_every_call(state, generated, meter, "escalated")
    for record in done[1:]:
        draft, escalation = record["calls"]
        assert (draft["role"], escalation["role"]) == ("draft", "escalation")
        assert escalation["uncertainty"] is not None  # the stronger model returned logprobs
        assert record["kept_uncertainty"] == record["uncertainty"]  # the momentum reads the draft


async def test_flagged_calls_are_drawn_again_and_voted_on(cpu_server: RunningServer) -> None:
    state, generated, meter = await run(cpu_server, MURMiddleware(samples=2, gamma=GAMMA))
    done = check_every_call(state, generated, meter, "voted")
    for record in done[1:]:
        assert [call["role"] for call in record["calls"]] == ["draft", "draw"]
        kept = [call for call in record["calls"] if call["kept"]]
        assert len(kept) == 1 and kept[0]["uncertainty"] == record["kept_uncertainty"]
