"""Solve one question by streaming the graph: the step events as they are kept, then the
output contract. run.py, the OpenAI-compatible endpoint and the tests all solve through here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph

from mur.graphs.state import Context, output_of

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
) -> Solution:
    """Stream `graph` on `question`; `on_step` sees each kept step's event as it is kept.

    With a checkpointed thread (`config={"configurable": {"thread_id": ...}}`) that already
    holds progress, the run resumes there (`on_resume` is told first) and the question is not
    sent again; a thread that had finished returns its output without running anything.
    """
    graph_input: dict[str, Any] | None = {"question": question, "system_prompt": system_prompt}
    resumed = False
    if config is not None:
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
