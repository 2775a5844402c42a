"""Solve one question by streaming the graph: the step events as they are kept, then the
output contract. run.py, the OpenAI-compatible endpoint and the tests all solve through here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Durability, StateSnapshot

from mur.graphs.state import Context, output_of
from mur.nodes.usage import add_usage

StepEvent = dict[str, Any]


ThreadStatus = Literal["new", "unfinished", "finished", "stale"]


async def thread_status(
    graph: CompiledStateGraph[Any, Context, Any, Any], config: RunnableConfig
) -> tuple[ThreadStatus, dict[str, Any]]:
    """Where a checkpointed thread stands, and its values: new (nothing saved), unfinished
    (a node is next: resume with input None), finished (its output is in the values), or
    stale (saved by an older version of the graph, stopped before a node this one lacks:
    nothing can go on from it, start afresh)."""
    snapshot = await graph.aget_state(config)
    if not snapshot.values:
        return "new", {}
    if snapshot.next:
        return "unfinished", snapshot.values
    if snapshot.values.get("finish_reason"):
        return "finished", snapshot.values
    return "stale", snapshot.values


@dataclass(frozen=True)
class SavedProgress:
    """What a checkpointed thread holds before a run goes on with it: the tokens its saved
    nodes spent (those of subgraphs still in flight included, each counted once) and, for a
    question of one trace, the steps that trace kept. A new thread holds nothing."""

    new: bool
    usage: dict[str, int] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)


async def saved_progress(
    graph: CompiledStateGraph[Any, Context, Any, Any], config: RunnableConfig
) -> SavedProgress:
    """The progress saved in `config`'s thread, read from its checkpoints (with subgraphs):
    what a resumed run does not spend again."""
    snapshot = await graph.aget_state(config, subgraphs=True)
    stale = not snapshot.next and not snapshot.values.get("finish_reason")  # see thread_status
    if not snapshot.values or stale:
        return SavedProgress(new=True)
    outputs = snapshot.values.get("outputs") or []
    steps = list(outputs[0].get("steps") or []) if outputs else _first_trace_steps(snapshot)
    return SavedProgress(False, _saved_usage(snapshot), steps)


def _saved_usage(snapshot: StateSnapshot) -> dict[str, int]:
    """A snapshot's usage plus that of its pending tasks: a finished one's result, or the
    saved state of one still in flight (a subgraph: recursively)."""
    usage: dict[str, int] = dict(snapshot.values.get("usage") or {})
    for task in snapshot.tasks:
        if task.result is not None:
            usage = add_usage(usage, task.result.get("usage") or {})
        elif isinstance(task.state, StateSnapshot):
            usage = add_usage(usage, _saved_usage(task.state))
    return usage


def _first_trace_steps(snapshot: StateSnapshot) -> list[dict[str, Any]]:
    """The steps kept so far by the first trace still pending (with one trace: the trace)."""
    for task in snapshot.tasks:
        if task.name == "trace" and task.result is not None:
            return list(((task.result.get("outputs") or [{}])[0]).get("steps") or [])
        if task.name == "trace" and isinstance(task.state, StateSnapshot):
            return list(task.state.values.get("steps") or [])
    return []


@dataclass
class Solution:
    """The output contract of one solved question and the step events that led to it."""

    output: dict[str, Any]
    steps: list[StepEvent] = field(default_factory=list)
    resumed: bool = False  # a checkpointed thread went on from where it had stopped


async def solve(
    graph: CompiledStateGraph[Any, Context, Any, Any],
    question: str,
    *,
    system_prompt: str | None = None,
    context: Context | None = None,
    config: RunnableConfig | None = None,
    on_step: Callable[[StepEvent], None] | None = None,
    on_resume: Callable[[], None] | None = None,
    durability: Durability | None = None,
) -> Solution:
    """Stream `graph` on `question`; `on_step` sees each kept step's event as it is kept.
    `durability` is LangGraph's (None: its default, checkpoints written in the background;
    "sync": each written before the next step starts, so a process killed mid-run loses at
    most the step in flight, and a database that stops answering stops the run at once).

    `config` may carry callbacks alone (a chat model's child run). With a checkpointed thread
    (`config={"configurable": {"thread_id": ...}}`) that already
    holds progress, the run resumes there (`on_resume` is told first) and the question is not
    sent again; a thread that had finished returns its output without running anything.
    """
    graph_input: dict[str, Any] | None = {"question": question, "system_prompt": system_prompt}
    resumed = False
    if config is not None and (config.get("configurable") or {}).get("thread_id") is not None:
        status, values = await thread_status(graph, config)
        if status == "unfinished":
            resumed, graph_input = True, None
            if on_resume is not None:
                on_resume()
        elif status == "finished":
            return Solution(output_of(values))
        elif status == "stale" and isinstance(graph.checkpointer, BaseCheckpointSaver):
            await graph.checkpointer.adelete_thread(config["configurable"]["thread_id"])
    steps: list[StepEvent] = []
    final: dict[str, Any] = {}
    async for part in graph.astream(
        graph_input,
        config=config,
        context=context,
        stream_mode=["custom", "values"],
        subgraphs=True,  # the step events come from inside the traces
        durability=durability,
    ):
        # With subgraphs and a list of modes each part is (namespace, mode, chunk), which the
        # stubs do not say; the question's values are those of the root namespace.
        namespace, mode, chunk = cast(tuple[tuple[str, ...], str, dict[str, Any]], part)
        if mode == "values":
            if not namespace:
                final = chunk
        elif chunk.get("event") == "step":
            steps.append(chunk)
            if on_step is not None:
                on_step(chunk)
    return Solution(output_of(final), steps, resumed)
