"""The MUR graph, assembled in one place. A question is solved by one or more traces and a
vote (graphs/traces.py):

    plan_traces --Send x batch--> trace --> plan_traces --(settled or all drawn)--> vote

and each trace is the MUR reasoning loop:

    draft_step -> score_uncertainty -> gamma_gate -> [the run's strategy] -> commit_step -> done?
                                                                        |-> draft_step (next step)
                                                                        |-> ask_answer (max_steps)
                                                                        '-> finalize

Each refine strategy of the registry (graphs/refine) is a subgraph mounted as a node of its
own name; gamma_gate routes a scaled step to the one the run's Context names, so one compiled
graph serves every strategy and `get_graph(xray=True)` (or Studio) draws each one's nodes.

A request that no longer fits the model's context ends the solution (finish_reason
"context_length"): a draft that overflows goes to finalize (or to ask_answer when the server
said enough room is left for a short answer), a strategy that overflows keeps the draft. How
every model-calling node fails, retries and counts its tokens: graphs/model_calls.py.

`build_graph(backbone=..., verifier=...)` returns the compiled graph; models are injected (any
LangChain chat model that returns OpenAI-format token logprobs), defaulting to clients of the
servers the environment names (MUR_BASE_URL, MUR_MODEL, ...: servers.clients.environment). The
graph never starts a server: the entry points do (servers.connect), and Studio's graph is
endpoint/studio.py. A run picks its strategy, gate and settings with
`context=Context(...)` (or a dict of them: LangGraph validates it into a Context).
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from mur.graphs.loop import (
    DEFAULT_CONTEXT,
    Drafting,
    answer_overflowed,
    commit_step,
    draft_overflowed,
    finalize,
    gamma_gate,
    route_commit,
    route_draft,
    route_gate,
    route_score,
    score_uncertainty,
)
from mur.graphs.model_calls import ModelCalls
from mur.graphs.refine import STRATEGIES, Kit
from mur.graphs.state import (
    Context,
    InputState,
    OutputState,
    QuestionState,
    State,
    TraceInput,
    TraceOutput,
)
from mur.graphs.traces import plan_traces, route_traces, trace_node, vote
from mur.servers.clients.environment import clients_from_env


def build_graph(
    *,
    backbone: BaseChatModel | None = None,
    verifier: BaseChatModel | None = None,
    checkpointer: Any = None,
) -> CompiledStateGraph[QuestionState, Context, InputState, OutputState]:
    """Compile the MUR graph: a question's traces (each the loop with every refine strategy
    mounted) and their vote. The verifier defaults to the backbone; without a backbone, both
    are clients of the servers the environment names (MUR_BASE_URL, MUR_MODEL, ...), and
    without those a ServerError says to start one."""
    loop = build_loop(backbone=backbone, verifier=verifier)
    graph = StateGraph(
        QuestionState, context_schema=Context, input_schema=InputState, output_schema=OutputState
    )
    graph.add_node("plan_traces", plan_traces)
    graph.add_node("trace", trace_node(loop))
    graph.add_node("vote", vote)
    graph.add_edge(START, "plan_traces")
    graph.add_conditional_edges("plan_traces", route_traces, ["trace", "vote"])
    graph.add_edge("trace", "plan_traces")
    graph.add_edge("vote", END)
    return graph.compile(checkpointer=checkpointer, name="mur")


def build_loop(
    *, backbone: BaseChatModel | None = None, verifier: BaseChatModel | None = None
) -> CompiledStateGraph[State, Context, TraceInput, TraceOutput]:
    """Compile one trace: the MUR loop with every refine strategy mounted (checkpointed by
    the graph that runs it)."""
    if backbone is None:
        backbone, default_verifier = clients_from_env()
        verifier = verifier or default_verifier
    verifier = verifier or backbone
    calls = ModelCalls()
    drafting = Drafting(backbone)

    graph = StateGraph(
        State, context_schema=Context, input_schema=TraceInput, output_schema=TraceOutput
    )
    calls.add(graph, "draft_step", drafting.draft_step, on_overflow=draft_overflowed)
    graph.add_node("score_uncertainty", score_uncertainty)
    graph.add_node("gamma_gate", gamma_gate)
    for strategy in STRATEGIES.values():
        kit = Kit(strategy.name, backbone, verifier, DEFAULT_CONTEXT, calls)
        graph.add_node(strategy.name, strategy.build(kit))
    graph.add_node("commit_step", commit_step)
    calls.add(graph, "ask_answer", drafting.ask_answer, on_overflow=answer_overflowed)
    graph.add_node("finalize", finalize)

    graph.add_edge(START, "draft_step")
    graph.add_conditional_edges(
        "draft_step", route_draft, ["score_uncertainty", "ask_answer", "finalize"]
    )
    graph.add_conditional_edges("score_uncertainty", route_score, ["gamma_gate", "finalize"])
    graph.add_conditional_edges("gamma_gate", route_gate, [*STRATEGIES, "commit_step"])
    for name in STRATEGIES:
        graph.add_edge(name, "commit_step")
    graph.add_conditional_edges(
        "commit_step", route_commit, ["draft_step", "ask_answer", "finalize"]
    )
    graph.add_edge("ask_answer", "finalize")
    graph.add_edge("finalize", END)
    return graph.compile(name="trace")
