"""Solve one question by streaming the graph: the step events as they are kept, then the
output contract. run.py, the OpenAI-compatible endpoint and the tests all solve through here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph

from graphs.state import Context, output_of

StepEvent = dict[str, Any]


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
        snapshot = await graph.aget_state(config)
        if snapshot.next:
            resumed, graph_input = True, None
            if on_resume is not None:
                on_resume()
        elif snapshot.values:
            return Solution(output_of(snapshot.values))  # that thread already finished
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
