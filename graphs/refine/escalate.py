"""Escalation, MUR as a step router: the external model (a larger one) writes the flagged
step again from the same prefix, and its step is kept.

The external model continues the backbone's own assistant message, so its step reads as the
backbone's next step and the backbone goes on from it. Its tokens are external tokens; the
draft's stay counted. What the momentum reads after a rewritten step is a setting
(`escalate_momentum`): the draft's uncertainty (what the backbone felt about the step it
wrote), or the backbone's uncertainty of the kept text, scored with vLLM's prompt logprobs
(nodes.rescore): either way a number on the backbone's own scale, never the external model's.
"""

from __future__ import annotations

from typing import Literal

from langgraph.graph import END, START
from langgraph.runtime import Runtime

from mur.graphs.refine.base import (
    CandidateSummary,
    Context,
    RefineRecord,
    Update,
    position,
    write_step,
)
from mur.graphs.refine.kit import RefineBuilder, Scratch, Strategy, StrategyNodes
from mur.nodes.draft import StepCandidate, step_messages
from mur.nodes.rescore import score_step

MomentumReading = Literal["draft", "rescored"]


class EscalateRecord(RefineRecord):
    strategy: Literal["escalate"]
    rewrite: CandidateSummary
    """The external model's step as it wrote it (its uncertainty is the external model's)."""
    momentum_reads: MomentumReading
    """What the step's `uncertainty`, and so the momentum, read: the draft's, or the
    backbone's of the kept text (`rescored`)."""

    def summary(self) -> str:
        return f"written by the external model, {self.rewrite.num_tokens} tokens"


class EscalateState(Scratch):
    """Escalation's scratch: the external model's step, once written, and the backbone's
    logprobs of its text, once scored."""

    rewrite: StepCandidate
    rescored: list[float]


class EscalateNodes(StrategyNodes):
    """The external model writes the step; the backbone scores it when the momentum reads
    the kept text."""

    def wire(self, graph: RefineBuilder) -> None:
        self.kit.add_model_node(graph, "rewrite", self.rewrite)
        self.kit.add_model_node(graph, "rescore", self.rescore)
        graph.add_node("keep", keep)
        graph.add_edge(START, "rewrite")
        graph.add_conditional_edges("rewrite", self.after_rewrite, ["rescore", "keep"])
        graph.add_edge("rescore", "keep")
        graph.add_edge("keep", END)

    async def rewrite(self, state: EscalateState, runtime: Runtime[Context]) -> Update:
        """The external model writes step t, continuing the backbone's kept steps."""
        ctx = self.kit.settings(runtime)
        texts, index = position(state)
        messages = step_messages(
            state["question"], state.get("system_prompt"), texts, index, ctx.step_style
        )
        step, reply = await write_step(self.kit.verifier, messages, index, ctx, role="external")
        return {"rewrite": step, "usage": reply.usage("external").as_dict()}

    async def after_rewrite(self, state: EscalateState, runtime: Runtime[Context]) -> str:
        """Rescore a step with text when the run reads the kept text; else keep it now."""
        wants = self.kit.settings(runtime).escalate_momentum == "rescored"
        return "rescore" if wants and state["rewrite"]["text"] else "keep"

    async def rescore(self, state: EscalateState, runtime: Runtime[Context]) -> Update:
        """The backbone's logprobs of the external model's step, for the momentum."""
        ctx = self.kit.settings(runtime)
        texts, index = position(state)
        logprobs, reply = await score_step(
            self.kit.backbone,
            question=state["question"],
            system_prompt=state.get("system_prompt"),
            kept_texts=texts,
            index=index,
            text=state["rewrite"]["text"],
            fmt=ctx.step_style,
        )
        return {"rescored": logprobs, "usage": reply.usage("backbone").as_dict()}


async def keep(state: EscalateState) -> Update:
    """Keep the external model's step, with what the momentum reads as its logprobs: the
    backbone's of its text once rescored, else the draft's (the loop keeps the draft itself
    if the rewrite has no tokens)."""
    rewrite, rescored = state["rewrite"], state.get("rescored")
    reads: MomentumReading = "rescored" if rescored else "draft"
    logprobs = rescored if rescored else state["draft"]["logprobs"]
    record = EscalateRecord(
        strategy="escalate",
        draft=CandidateSummary.of(state["draft"]),
        rewrite=CandidateSummary.of(rewrite),
        momentum_reads=reads,
    )
    return {"kept": {**rewrite, "logprobs": logprobs}, "refine": record.as_dict()}


STRATEGY = Strategy(
    "escalate",
    EscalateState,
    EscalateNodes,
    EscalateRecord,
    "the external model rewrites the step (a cascade)",
)
