"""One compiled graph holds every strategy: its drawing (Studio's, `get_graph(xray=True)`) shows
the loop's nodes and each strategy's own, and langgraph.json serves that graph. Without models
the graph uses the servers the environment names, through the clients side of servers only."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from fakes import FakeLogprobChat, Scripted
from mur.graphs.loop import DEFAULT_CONTEXT
from mur.graphs.model_calls import ModelCalls
from mur.graphs.mur import build_graph
from mur.graphs.refine import STRATEGIES, Kit
from mur.graphs.solve import solve
from mur.graphs.state import Context
from mur.servers.clients.errors import ServerError

ROOT = Path(__file__).resolve().parents[2]
LOOP = {"draft_step", "score_uncertainty", "gamma_gate", "commit_step", "ask_answer", "finalize"}
ENDS = {"__start__", "__end__"}


def fake() -> FakeLogprobChat:
    return FakeLogprobChat(responder=lambda messages, kwargs: Scripted(" x", [-0.1] * 3))


def inner_nodes(strategy: str) -> set[str]:
    """The nodes of `strategy`'s subgraph, drawn on its own."""
    kit = Kit(strategy, fake(), fake(), DEFAULT_CONTEXT, ModelCalls())
    return set(STRATEGIES[strategy].build(kit).get_graph().nodes) - ENDS


def test_the_drawing_shows_the_traces_the_loop_and_every_strategys_own_nodes() -> None:
    drawing = build_graph(backbone=fake()).get_graph(xray=True)
    nodes = set(drawing.nodes)
    edges = {(edge.source, edge.target) for edge in drawing.edges}
    # The question level: traces fan out from plan_traces and a vote reduces them.
    assert {"plan_traces", "vote", *ENDS} <= nodes
    assert {("__start__", "plan_traces"), ("vote", "__end__")} <= edges
    assert any(a == "plan_traces" and b.startswith("trace:") for a, b in edges)
    assert any(a.startswith("trace:") and b == "plan_traces" for a, b in edges)
    # Each trace is the loop, drawn inside the trace node.
    assert {f"trace:{name}" for name in LOOP} <= nodes
    assert {
        ("trace:draft_step", "trace:score_uncertainty"),
        ("trace:score_uncertainty", "trace:gamma_gate"),
        ("trace:gamma_gate", "trace:commit_step"),
        ("trace:commit_step", "trace:draft_step"),
        ("trace:ask_answer", "trace:finalize"),
    } <= edges
    assert inner_nodes("critic") == {"critique", "revise", "record"}
    for strategy in STRATEGIES:
        own = {f"trace:{strategy}:{name}" for name in inner_nodes(strategy)}
        assert own and own <= nodes, f"{strategy}'s nodes are not drawn"
        # gamma_gate leads into the strategy, and its last node on to commit_step.
        assert any(a == "trace:gamma_gate" and b.startswith(f"trace:{strategy}:") for a, b in edges)
        assert any(a in own and b == "trace:commit_step" for a, b in edges)
    drawn = {node.split(":")[1] for node in nodes if node.count(":") >= 2}
    assert drawn == set(STRATEGIES)  # nothing else is mounted, nothing is missing


def test_langgraph_json_serves_the_one_graph_of_the_studio_module() -> None:
    config = json.loads((ROOT / "langgraph.json").read_text())
    assert list(config["graphs"]) == ["mur"]
    path, name = config["graphs"]["mur"].split(":")
    dotted = Path(path).with_suffix("").as_posix().removeprefix("./").replace("/", ".")
    module = importlib.import_module(f"mur.{dotted}")  # the room, by the name it is installed as
    graph = getattr(module, name)
    nodes = set(graph.get_graph(xray=True).nodes)
    assert all(any(n.startswith(f"trace:{s}:") for n in nodes) for s in STRATEGIES)


def test_a_graph_without_models_uses_the_servers_the_environment_names(monkeypatch) -> None:
    for name in ("MUR_BASE_URL", "MUR_MODEL", "MUR_VERIFIER_URL", "MUR_VERIFIER_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ServerError, match=r"MUR_BASE_URL is unset.*`mur servers up`"):
        build_graph()
    # Named by the environment, the clients are made without asking the server.
    monkeypatch.setenv("MUR_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MUR_MODEL", "m")
    assert {node.split(":")[0] for node in build_graph().get_graph(xray=True).nodes} >= {"trace"}


def test_the_graph_loads_only_the_clients_side_of_servers() -> None:
    # At run time too, not only in the import contracts: a fresh interpreter builds the graph.
    code = (
        "import sys; from mur.graphs.mur import build_graph; "
        "print(sorted(m for m in sys.modules if m.startswith('mur.servers.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(done.stdout)
    assert loaded and all(m.startswith("mur.servers.clients") for m in loaded), loaded


class Crash(Exception):
    """The process dying mid-run."""


def critic_script(crash: bool):
    """Step 1 (scaled) is judged wrong and revised into the answer; with `crash` the revision
    request dies."""

    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if isinstance(messages[0], HumanMessage) and "You are a teacher" in messages[0].content:
            return Scripted("Wrong. \\boxed{No}", [-0.1] * 5, stop_reason=None)
        if "incorrect" in str(messages[-2].content):
            if crash:
                raise Crash("died revising step 1")
            return Scripted(" so the answer is 7.", [-0.2] * 3, stop_reason=None)
        return Scripted(" draft", [-0.5] * 4)

    return respond


async def test_a_checkpointed_run_resumes_inside_the_strategy() -> None:
    saver, config = InMemorySaver(), {"configurable": {"thread_id": "t"}}
    context = Context(gate="always")
    crashing = FakeLogprobChat(responder=critic_script(crash=True))
    with pytest.raises(Crash):
        await solve(
            build_graph(backbone=crashing, checkpointer=saver),
            "3 + 4?",
            context=context,
            config=config,
        )
    healthy = FakeLogprobChat(responder=critic_script(crash=False))
    solution = await solve(
        build_graph(backbone=healthy, checkpointer=saver), "3 + 4?", context=context, config=config
    )
    assert solution.resumed and solution.output["answer"] == "7"
    assert len(healthy.calls) == 1  # the revision alone: the draft and the critique were kept
    assert solution.output["usage"] == {
        "backbone_tokens": 4 + 3,
        "external_tokens": 5,
        "backbone_prompt_tokens": 2 * 10,
        "external_prompt_tokens": 10,
        "llm_calls": 3,
        "failed_calls": 0,  # the crashed run's failed request is not in the thread's state
    }
