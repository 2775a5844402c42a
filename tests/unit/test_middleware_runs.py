"""MURMiddleware over whole runs, scripted (tests/agent_fakes.py): the escalation budget and
the token limit, the momentum kept across a checkpointed thread's resume after an interrupt or
a failed call (as a new process would: a new saver, model, middleware and agent over the same
database file, run synchronously), a new run starting its gate afresh, and
docs/examples/middleware.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_fakes import ScriptedAgentModel, calls, says
from examples import example
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command, interrupt

from mur import MURMiddleware
from mur.nodes.gates import GateParams, mur_threshold
from mur.nodes.uncertainty import update_momentum

QUESTION = {"messages": [("user", "What is 2 + 3?")]}
THREAD = {"configurable": {"thread_id": "thread-1"}}


@tool
def add(a: int, b: int) -> int:
    """The sum a + b."""
    return a + b


@tool
def ask_the_user(question: str) -> str:
    """Ask the user, and wait for the answer."""
    return str(interrupt(question))


TOOLS: list[BaseTool] = [add, ask_the_user]


def agent_over(model: ScriptedAgentModel, checkpointer: Any = None, **settings: Any) -> Any:
    middleware = [MURMiddleware(**settings)]
    return create_agent(model, tools=TOOLS, middleware=middleware, checkpointer=checkpointer)


def records(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [m.response_metadata["mur"] for m in state["messages"] if isinstance(m, AIMessage)]


async def test_past_the_escalation_budget_flagged_calls_are_no_longer_escalated() -> None:
    model = ScriptedAgentModel(
        script=[
            calls("add", {"a": 2, "b": 3}, 0.2),  # 4 tokens, the first call: never flagged
            calls("add", {"a": 5, "b": 1}, 2.0, tokens=3),  # 7 tokens so far: escalated
            says("6", 2.0),  # flagged, but 9 + 3 tokens >= 8: kept as drafted
        ]
    )
    strong = ScriptedAgentModel(
        script=[calls("add", {"a": 5, "b": 1}, 0.1, tokens=2)], model_name="strong"
    )
    agent = agent_over(model, escalate_to=strong, escalation_budget=8)
    state = await agent.ainvoke(QUESTION)
    done = records(state)
    assert [(r["flagged"], r["action"]) for r in done] == [
        (False, "kept"),
        (True, "escalated"),
        (True, "budget_spent"),
    ]
    assert len(strong.asked) == 1
    assert state["messages"][-1].content == "6"
    assert state["mur_tokens"] == done[-1]["run_tokens"] == 4 + 3 + 2 + 3


async def test_past_the_token_limit_the_run_ends_with_a_message_saying_so() -> None:
    model = ScriptedAgentModel(
        script=[calls("add", {"a": 2, "b": 3}, 0.2), calls("add", {"a": 5, "b": 1}, 0.1)]
    )
    state = await agent_over(model, samples=2, token_limit=6).ainvoke(QUESTION)
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    assert last.content == (
        "Stopped by MURMiddleware's token limit: this run generated 8 tokens, its limit is 6. "
        "Raise token_limit, or ask again in a new run."
    )
    assert last.response_metadata["mur"] == {
        "action": "token_limit", "run_tokens": 8, "token_limit": 6
    }  # fmt: skip
    assert [type(m).__name__ for m in state["messages"]] == [
        "HumanMessage", "AIMessage", "ToolMessage", "AIMessage", "ToolMessage", "AIMessage"
    ]  # fmt: skip
    assert len(model.asked) == 2  # the tools both calls asked for ran; no third call
    assert state["mur_tokens"] == 8


def test_the_momentum_survives_a_checkpointed_threads_resume(tmp_path: Path) -> None:
    database = str(tmp_path / "threads.sqlite")
    with SqliteSaver.from_conn_string(database) as saver:
        asking = ScriptedAgentModel(
            script=[calls("ask_the_user", {"question": "Which numbers?"}, 2.0)]
        )
        agent = agent_over(asking, saver, samples=2)
        agent.invoke(QUESTION, THREAD)
        paused = agent.get_state(THREAD)
        assert paused.interrupts  # waiting for the user inside the tool
        momentum = paused.values["mur_momentum"]
        assert momentum == pytest.approx(update_momentum(0.0, 2.0, 0.9))
    # Another process: a new saver on the file, a new model, middleware and agent.
    with SqliteSaver.from_conn_string(database) as saver:
        answering = ScriptedAgentModel(script=[says("5", 0.1)])
        agent = agent_over(answering, saver, samples=2)
        state = agent.invoke(Command(resume="2 and 3"), THREAD)
    resumed = records(state)[-1]
    assert state["messages"][-2].content == "2 and 3"
    assert resumed["call"] == 2  # the run's second call: the history came from the checkpoint
    assert resumed["momentum_before"] == pytest.approx(momentum)
    assert resumed["threshold"] == pytest.approx(mur_threshold(momentum, 1, GateParams()))
    assert state["mur_uncertainties"] == pytest.approx([2.0, 0.1])
    assert state["mur_momentum"] == pytest.approx(update_momentum(momentum, 0.1, 0.9))


def test_a_run_retried_after_a_failed_call_keeps_its_momentum(tmp_path: Path) -> None:
    database = str(tmp_path / "threads.sqlite")
    with SqliteSaver.from_conn_string(database) as saver:
        failing = ScriptedAgentModel(script=[calls("add", {"a": 2, "b": 3}, 2.0)])
        with pytest.raises(AssertionError, match="called more often than scripted"):
            agent_over(failing, saver, samples=2).invoke(QUESTION, THREAD)  # its second call
    with SqliteSaver.from_conn_string(database) as saver:
        answering = ScriptedAgentModel(script=[says("5", 0.1)])
        state = agent_over(answering, saver, samples=2).invoke(None, THREAD)
    retried = records(state)[-1]
    assert retried["call"] == 2
    assert retried["momentum_before"] == pytest.approx(update_momentum(0.0, 2.0, 0.9))
    assert state["mur_uncertainties"] == pytest.approx([2.0, 0.1])


async def test_a_new_run_on_the_thread_starts_its_gate_afresh() -> None:
    model = ScriptedAgentModel(
        script=[calls("add", {"a": 2, "b": 3}, 3.0), says("5", 0.1), says("7", 2.0)]
    )
    agent = agent_over(model, InMemorySaver(), samples=2)
    await agent.ainvoke(QUESTION, THREAD)
    state = await agent.ainvoke({"messages": [("user", "And 3 + 4?")]}, THREAD)
    latest = records(state)[-1]
    assert latest["call"] == 1  # not flagged, however uncertain: the run's first call
    assert (latest["momentum_before"], latest["threshold"], latest["flagged"]) == (0.0, None, False)
    assert state["mur_uncertainties"] == pytest.approx([2.0])
    assert state["mur_tokens"] == 3
    assert [r["call"] for r in records(state)] == [1, 2, 1]  # each message keeps its record


async def test_with_thread_scope_a_new_run_goes_on_from_the_threads_momentum() -> None:
    model = ScriptedAgentModel(
        script=[
            calls("add", {"a": 2, "b": 3}, 3.0),
            says("5", 0.1),
            says("7", 2.0),  # far above the thread's momentum: flagged, one more draw votes
            says("7", 1.5),
        ]
    )
    agent = agent_over(model, InMemorySaver(), samples=2, momentum_scope="thread")
    first = await agent.ainvoke(QUESTION, THREAD)
    state = await agent.ainvoke({"messages": [("user", "And 3 + 4?")]}, THREAD)
    latest = records(state)[-1]
    assert latest["call"] == 3  # the thread's third call, gated against its first two
    assert latest["momentum_before"] == first["mur_momentum"]
    assert (latest["flagged"], latest["action"]) == (True, "voted")
    assert state["mur_uncertainties"] == pytest.approx([3.0, 0.1, 1.5])  # the kept draw's
    assert state["mur_tokens"] == first["mur_tokens"] + 3 + 3


def test_a_momentum_scope_other_than_run_or_thread_is_refused() -> None:
    with pytest.raises(ValueError, match="momentum_scope must be run or thread, got 'case'"):
        MURMiddleware(samples=2, momentum_scope="case")


async def test_the_example_prints_each_calls_numbers() -> None:
    middleware_example = example("middleware")
    model = ScriptedAgentModel(
        script=[
            calls("multiply", {"a": 17, "b": 23}, 3.0),
            says("391", 2.0),  # flagged: two more draws vote
            says("391", 1.0),
            says(" 391", 1.5),
        ]
    )
    agent = middleware_example.build_agent(model, samples=3)
    state = await agent.ainvoke({"messages": [("user", "What is 17 * 23?")]})
    assert middleware_example.describe(state) == [
        "call 1: uncertainty 3.000, threshold -, momentum 0.000 -> 0.300: kept",
        "call 2: uncertainty 2.000, threshold 0.405, momentum 0.300 -> 0.370: voted",
    ]
    assert state["messages"][2].content == "391"  # the tool's product
    assert state["mur_tokens"] == 4 + 3 * 3
