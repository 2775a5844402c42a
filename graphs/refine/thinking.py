"""Thinking switch: the flagged step is written again after thinking (capped at
`thinking_budget` tokens, whole sentences kept, the think block closed)."""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime

from mur.graphs.refine.base import CandidateSummary, Context, RefineRecord, Update, position
from mur.graphs.refine.kit import RefineBuilder, Scratch, Strategy, StrategyNodes, chain
from mur.nodes.thinking import think, think_block, thinking_conversation


class ThinkingRecord(RefineRecord):
    strategy: Literal["thinking"]
    thinking: str
    thinking_tokens: int
    capped: bool

    def summary(self) -> str:
        return f"thought {self.thinking_tokens} tokens"


class ThinkingState(Scratch):
    """The thinking switch's scratch: the thought, once thought."""

    thought: dict[str, Any]  # text, capped, num_tokens


class ThinkingNodes(StrategyNodes):
    """The thinking switch's nodes over the injected backbone: think, then write the step."""

    def wire(self, graph: RefineBuilder) -> None:
        self.kit.add_model_node(graph, "think", self.think_about_step)
        self.kit.add_model_node(graph, "write_step", self.write_step)
        chain(graph, "think", "write_step")

    async def think_about_step(self, state: ThinkingState, runtime: Runtime[Context]) -> Update:
        """Think (capped at thinking_budget, whole sentences kept) about the flagged step."""
        ctx = self.kit.settings(runtime)
        texts, index = position(state)
        conv = thinking_conversation(
            state["question"], state.get("system_prompt"), texts, index, ctx.step_style
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
        texts, index = position(state)
        fmt = ctx.step_style
        conv = thinking_conversation(
            state["question"], state.get("system_prompt"), texts, index, fmt
        )
        block = think_block(state["thought"]["text"], ctx.thinking_style)
        messages = [*conv, AIMessage(block + fmt.prefix(texts, index))]
        step, reply = await self.rewrite_step(messages, index, ctx)
        record = ThinkingRecord(
            strategy="thinking",
            draft=CandidateSummary.of(state["draft"]),
            thinking=state["thought"]["text"],
            thinking_tokens=state["thought"]["num_tokens"],
            capped=state["thought"]["capped"],
        )
        return {
            "kept": step,
            "refine": record.as_dict(),
            "usage": reply.usage("backbone").as_dict(),
        }


STRATEGY = Strategy(
    "thinking", ThinkingState, ThinkingNodes, ThinkingRecord, "thinking switch", uses_verifier=False
)
