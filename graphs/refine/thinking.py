"""Thinking switch: the flagged step is written again after thinking (capped at
`thinking_budget` tokens, whole sentences kept, the think block closed)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langchain_core.messages import AIMessage
from langgraph.graph import END, START
from langgraph.runtime import Runtime

from mur.graphs.refine.base import (
    CandidateSummary,
    Context,
    Kit,
    RefineGraph,
    RefineInput,
    RefineOutput,
    RefineRecord,
    Strategy,
    Update,
    kept_texts,
    new_graph,
    single_step_turn,
    step_index,
    write_step,
)
from mur.nodes.thinking import think, think_block, thinking_conversation
from mur.nodes.usage import add_usage


class ThinkingRecord(RefineRecord):
    strategy: Literal["thinking"]
    thinking: str
    thinking_tokens: int
    capped: bool

    def summary(self) -> str:
        return f"thought {self.thinking_tokens} tokens"


class ThinkingState(RefineInput, RefineOutput):
    """Scratch space; only `kept`, `refine` and `usage` go back to the loop."""

    usage: Annotated[dict[str, int], add_usage]
    thought: dict[str, Any]  # text, capped, num_tokens


class ThinkingNodes:
    """The thinking switch's nodes over the injected backbone."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit

    async def think_about_step(self, state: ThinkingState, runtime: Runtime[Context]) -> Update:
        """Think (capped at thinking_budget, whole sentences kept) about the flagged step."""
        ctx = self.kit.settings(runtime)
        conv = thinking_conversation(
            state["question"],
            state.get("system_prompt"),
            kept_texts(state),
            step_index(state),
            ctx.step_style,
        )
        thought, capped, num_tokens, reply = await think(
            self.kit.backbone, conv, style=ctx.thinking_style, budget=ctx.thinking_budget
        )
        return {
            "thought": {"text": thought, "capped": capped, "num_tokens": num_tokens},
            "usage": reply.usage("backbone").as_dict(),
        }

    async def write_step(self, state: ThinkingState, runtime: Runtime[Context]) -> Update:
        """Write the step after the closed think block; its uncertainty feeds the momentum.

        Sent with thinking off, like every step: the think block is in the continued message
        itself (Qwen3's template renders it from the text whatever enable_thinking says), and
        with thinking on vLLM's qwen3 reasoning parser would file the step as reasoning."""
        ctx = self.kit.settings(runtime)
        texts, index = kept_texts(state), step_index(state)
        fmt = ctx.step_style
        conv = thinking_conversation(
            state["question"], state.get("system_prompt"), texts, index, fmt
        )
        block = think_block(state["thought"]["text"], ctx.thinking_style)
        messages = [*conv, AIMessage(block + fmt.prefix(texts, index))]
        step, reply = await write_step(self.kit.backbone, messages, index, ctx)
        record = ThinkingRecord(
            strategy="thinking",
            draft=CandidateSummary.of(state["draft"]),
            thinking=state["thought"]["text"],
            thinking_tokens=state["thought"]["num_tokens"],
            capped=state["thought"]["capped"],
        )
        return {
            "kept": single_step_turn(step),
            "refine": record.as_dict(),
            "usage": reply.usage("backbone").as_dict(),
        }


def build(kit: Kit) -> RefineGraph:
    nodes = ThinkingNodes(kit)
    graph = new_graph(ThinkingState)
    kit.add_model_node(graph, "think", nodes.think_about_step)
    kit.add_model_node(graph, "write_step", nodes.write_step)
    graph.add_edge(START, "think")
    graph.add_edge("think", "write_step")
    graph.add_edge("write_step", END)
    return graph.compile(name="refine_thinking")


STRATEGY = Strategy("thinking", build, ThinkingRecord, uses_verifier=False)
