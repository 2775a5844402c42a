"""MURMiddleware (integrations/middleware.py) in LangChain's create_agent, over scripted models that
answer like vLLM (tests/agent_fakes.py): every call measured and its numbers in the message,
the momentum in the agent's state, a flagged call escalated or drawn again to vote, the
escalation's tokens in the message's usage and in LangChain's meters, and bad settings or a
model without logprobs refused in one line. Budgets and resumed threads:
tests/unit/test_middleware_runs.py; live: tests/integration/test_middleware_live.py."""

from __future__ import annotations

from typing import Any

import pytest
from agent_fakes import Said, ScriptedAgentModel, calls, says
from langchain.agents import create_agent
from langchain_core.callbacks import get_usage_metadata_callback
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from mur import MURMiddleware
from mur.graphs.state import ContextError
from mur.nodes.agent_calls import agreement_key, vote
from mur.nodes.gates import GateParams, mur_threshold, replay_decisions
from mur.nodes.llm import MissingLogprobsError
from mur.nodes.uncertainty import update_momentum

QUESTION = {"messages": [("user", "What is 2 + 3?")]}


@tool
def add(a: int, b: int) -> int:
    """The sum a + b."""
    return a + b


def agent_over(model: ScriptedAgentModel, **settings: Any) -> Any:
    return create_agent(model, tools=[add], middleware=[MURMiddleware(**settings)])


def replies(state: dict[str, Any]) -> list[AIMessage]:
    return [m for m in state["messages"] if isinstance(m, AIMessage)]


def records(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [m.response_metadata["mur"] for m in replies(state)]


async def test_every_call_is_measured_and_the_momentum_kept_in_the_state() -> None:
    model = ScriptedAgentModel(script=[calls("add", {"a": 2, "b": 3}, 3.0), says("5", 0.1)])
    state = await agent_over(model, samples=3).ainvoke(QUESTION)
    first, second = records(state)
    momentum = update_momentum(0.0, 3.0, 0.9)
    # The first call, however uncertain, has no momentum to compare with: never flagged.
    assert first == {
        "call": 1,
        "gate": "mur",
        "uncertainty": pytest.approx(3.0),
        "confidence": pytest.approx(0.049787, abs=1e-6),
        "threshold": None,
        "flagged": False,
        "action": "kept",
        "momentum_before": 0.0,
        "momentum_after": pytest.approx(momentum),
        "kept_uncertainty": pytest.approx(3.0),
        "run_tokens": 4,
        "calls": [
            {"role": "draft", "model": "scripted-agent", "uncertainty": pytest.approx(3.0),
             "input_tokens": 10, "output_tokens": 4}
        ],
    }  # fmt: skip
    assert second["threshold"] == pytest.approx(mur_threshold(momentum, 1, GateParams()))
    assert (second["flagged"], second["action"]) == (False, "kept")
    assert second["momentum_before"] == pytest.approx(momentum)
    assert state["mur_momentum"] == pytest.approx(update_momentum(momentum, 0.1, 0.9))
    assert state["mur_uncertainties"] == pytest.approx([3.0, 0.1])
    assert state["mur_tokens"] == 7
    assert [r["flagged"] for r in (first, second)] == replay_decisions("mur", [3.0, 0.1])
    assert all(asked["settings"]["logprobs"] is True for asked in model.asked)
    assert len(model.asked) == 2  # nothing flagged: no draw


async def test_a_flagged_call_is_rewritten_by_the_stronger_model() -> None:
    model = ScriptedAgentModel(script=[calls("add", {"a": 2, "b": 3}, 0.2), says("6", 2.0)])
    strong = ScriptedAgentModel(script=[says("5", 0.5, tokens=2)], model_name="strong")
    state = await agent_over(model, escalate_to=strong).ainvoke(QUESTION)
    answer = replies(state)[-1]
    record = answer.response_metadata["mur"]
    assert answer.content == "5"
    assert answer.response_metadata["model_name"] == "strong"
    assert (record["flagged"], record["action"]) == (True, "escalated")
    assert record["uncertainty"] == pytest.approx(2.0)
    # The momentum reads the agent's own model: the draft, not the stronger model's reply.
    assert record["kept_uncertainty"] == pytest.approx(2.0)
    assert state["mur_momentum"] == pytest.approx(update_momentum(0.02, 2.0, 0.9))
    assert [call["role"] for call in record["calls"]] == ["draft", "escalation"]
    assert record["calls"][1] == {
        "role": "escalation", "model": "strong", "uncertainty": None,
        "input_tokens": 10, "output_tokens": 2
    }  # fmt: skip
    # Both calls' tokens are the message's usage; the run counts every token generated.
    assert answer.usage_metadata == {"input_tokens": 20, "output_tokens": 5, "total_tokens": 25}
    assert state["mur_tokens"] == 4 + 3 + 2
    # The stronger model gets the agent's own request: its messages and tools, no logprobs
    # forced on it (a hosted model may refuse them).
    asked, escalated = model.asked[-1], strong.asked[0]
    assert escalated["messages"] == asked["messages"]
    assert escalated["settings"]["tools"] == asked["settings"]["tools"]
    assert "logprobs" not in escalated["settings"]


async def test_flagged_calls_draw_samples_that_vote_for_what_most_agree_on() -> None:
    model = ScriptedAgentModel(
        script=[
            calls("add", {"a": 2, "b": 3}, 1.0),  # the flagged call: the first vote
            calls("add", {"b": 3, "a": 2.0}, 0.5),  # the same call, written otherwise
            calls("add", {"a": 2, "b": 4}, 0.1),  # surer, but alone
            says("5", 0.3),
            says(" 5 ", 0.2),
            says("five", 0.05),
        ]
    )
    state = await agent_over(model, samples=3, gate="always").ainvoke(QUESTION)
    tool_call, answer = replies(state)
    first, second = records(state)
    assert (first["action"], second["action"]) == ("voted", "voted")
    assert tool_call.tool_calls[0]["args"] == {"b": 3, "a": 2.0}
    assert state["messages"][2].content == "5"  # the tool ran the kept call
    assert answer.content == " 5 "
    # Ties go to the least uncertain of the draws most agree with.
    assert sorted((c["uncertainty"], c["votes"], c["kept"]) for c in first["calls"]) == [
        (pytest.approx(0.1), 1, False),
        (pytest.approx(0.5), 2, True),
        (pytest.approx(1.0), 2, False),
    ]
    assert first["calls"][0]["role"] == "draft"
    assert state["mur_uncertainties"] == pytest.approx([0.5, 0.2])  # the kept draws'
    assert tool_call.usage_metadata is not None and answer.usage_metadata is not None
    assert tool_call.usage_metadata["output_tokens"] == 3 * 4
    assert answer.usage_metadata["output_tokens"] == 3 * 3
    assert state["mur_tokens"] == 12 + 9
    assert all(asked["settings"]["logprobs"] is True for asked in model.asked)


def test_draws_agree_on_tool_names_and_normalised_arguments_in_any_order() -> None:
    def called(*pairs: tuple[str, dict[str, Any]]) -> AIMessage:
        made = [{"name": n, "args": a, "id": f"c{i}"} for i, (n, a) in enumerate(pairs)]
        return AIMessage("", tool_calls=made)

    same = agreement_key(called(("add", {"a": 2, "b": " x "}), ("mul", {"c": [1.0]})))
    assert agreement_key(called(("mul", {"c": [1]}), ("add", {"b": "x", "a": 2.0}))) == same
    assert agreement_key(called(("add", {"a": 2, "b": "y"}), ("mul", {"c": [1]}))) != same
    assert agreement_key(called(("sub", {"a": 2, "b": "x"}), ("mul", {"c": [1]}))) != same
    assert agreement_key(AIMessage("The answer is 5")) == agreement_key(
        AIMessage(" The  answer is\n5 ")
    )
    assert agreement_key(AIMessage("5")) != agreement_key(called(("add", {"a": 5})))


def test_a_vote_keeps_the_least_uncertain_of_the_largest_agreement() -> None:
    assert vote(["a", "b", "c"], [0.3, 0.1, 0.2]) == (1, [1, 1, 1])
    assert vote(["a", "b", "a"], [0.3, 0.1, 0.2]) == (2, [2, 1, 2])
    assert vote(["a", "a"], [0.2, 0.2]) == (0, [2, 2])  # equal: the earlier draw


async def test_the_first_token_gate_reads_top_logprobs_and_judges_the_first_call() -> None:
    hesitant, sure = [("add", -0.7), ("The", -0.8), ("5", -1.0)], [("x", -0.01)]
    call = [("add", {"a": 2, "b": 3})]
    model = ScriptedAgentModel(
        script=[
            Said([-0.2] * 4, calls=call, first_alternatives=hesitant),
            Said([-0.4] * 4, calls=call, first_alternatives=sure),
            Said([-0.1] * 3, text="5", first_alternatives=sure),
        ]
    )
    agent = agent_over(model, samples=2, gate="first_token", top_logprobs=3)
    state = await agent.ainvoke(QUESTION)
    first, second = records(state)
    assert first["first_token_entropy"] > 1.0  # the default first_token_threshold
    assert (first["call"], first["flagged"], first["action"]) == (1, True, "voted")
    assert (second["flagged"], second["action"]) == (False, "kept")  # no alternatives: sure
    assert all(asked["settings"]["top_logprobs"] == 3 for asked in model.asked)


async def test_a_model_without_logprobs_is_one_clear_line() -> None:
    model = ScriptedAgentModel(script=[says("5", 0.1)], serves_logprobs=False)
    with pytest.raises(MissingLogprobsError) as refused:
        await agent_over(model, samples=3).ainvoke(QUESTION)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("the agent's model scripted-agent replied without token logprobs")
    assert "ChatOpenAI against vLLM" in line


@pytest.mark.parametrize(
    ("settings", "error", "line"),
    [
        ({}, ValueError, "give MURMiddleware one way to act on a flagged call"),
        ({"samples": 2, "escalate_to": "x"}, ValueError, "give MURMiddleware one way to act"),
        ({"samples": 1}, ValueError, "samples must be an integer >= 2"),
        ({"samples": True}, ValueError, "samples must be an integer >= 2"),
        ({"samples": 3, "token_limit": 0}, ValueError, "token_limit must be a number of tokens"),
        ({"samples": 3, "escalation_budget": 2.5}, ValueError, "escalation_budget must be"),
        ({"samples": 3, "strategy": "critic"}, ValueError, "MURMiddleware takes the gate's"),
        ({"samples": 3, "gamma": "high"}, ContextError, "gamma must be a valid number"),
        ({"samples": 3, "gate": "often"}, ContextError, "unknown gate 'often': choose one of"),
        ({"samples": 3, "gate": "first_token"}, ContextError, "gate first_token reads the"),
    ],
)
def test_bad_settings_are_one_line(settings: dict[str, Any], error: type, line: str) -> None:
    with pytest.raises(error) as refused:
        MURMiddleware(**settings)
    assert str(refused.value).startswith(line)
    assert "\n" not in str(refused.value)


async def test_langchains_meters_count_each_call_once_under_its_model() -> None:
    model = ScriptedAgentModel(script=[calls("add", {"a": 2, "b": 3}, 0.2), says("6", 2.0)])
    strong = ScriptedAgentModel(script=[says("5", 0.5, tokens=2)], model_name="strong")
    with get_usage_metadata_callback() as meter:
        state = await agent_over(model, escalate_to=strong).ainvoke(QUESTION)
    assert {name: usage["output_tokens"] for name, usage in meter.usage_metadata.items()} == {
        "scripted-agent": 4 + 3,
        "strong": 2,
    }
    in_messages = sum(m.usage_metadata["output_tokens"] for m in replies(state) if m.usage_metadata)
    assert in_messages == state["mur_tokens"] == 9
