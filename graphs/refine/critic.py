"""LLM as a critic: the external model judges the flagged step; unless it says Yes, its
analysis goes back to the backbone, which rewrites the step (`critic_rounds` rounds)."""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START
from langgraph.runtime import Runtime
from pydantic import BaseModel, model_serializer

from mur.graphs.refine.base import CandidateSummary, Context, RefineRecord, Update, position
from mur.graphs.refine.kit import RefineBuilder, Scratch, Strategy, StrategyNodes
from mur.nodes.draft import StepCandidate, conversation
from mur.nodes.judge import analysis_of
from mur.prompts.mur import CRITIC_FEEDBACK


class CriticRound(BaseModel):
    """One judgement of the current version of the step, and the revision it led to."""

    step: str
    critique: str
    verdict: bool | None
    num_tokens: int
    revised: bool
    revision: str | None = None

    @model_serializer(mode="wrap")
    def _revision_only_when_revised(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.revision is None:
            data.pop("revision", None)
        return data


class CriticRecord(RefineRecord):
    strategy: Literal["critic"]
    rounds: list[CriticRound]
    revised: bool

    def summary(self) -> str:
        return "revised" if self.revised else "judged correct"


class CriticState(Scratch):
    """The critic's scratch: its rounds so far."""

    critiques: list[dict[str, Any]]  # CriticRound dicts, the latest last


class CriticNodes(StrategyNodes):
    """The critic's nodes over the injected models: the verifier judges, the backbone revises."""

    def wire(self, graph: RefineBuilder) -> None:
        self.kit.add_model_node(graph, "critique", self.critique)
        self.kit.add_model_node(graph, "revise", self.revise)
        graph.add_node("record", record)
        graph.add_edge(START, "critique")
        graph.add_conditional_edges("critique", after_critique, ["revise", "record"])
        graph.add_conditional_edges("revise", self.after_revise, ["critique", "record"])
        graph.add_edge("record", END)

    async def critique(self, state: CriticState, runtime: Runtime[Context]) -> Update:
        """The external model judges the current version of the step."""
        current: StepCandidate = state.get("kept") or state["draft"]
        judgement, usage = await self.judge(state, current["text"], runtime)
        round_ = CriticRound(
            step=current["text"],
            critique=judgement["text"],
            verdict=judgement["verdict"],
            num_tokens=judgement["num_tokens"],
            revised=False,
        )
        return {
            "kept": current,
            "critiques": [*state.get("critiques", []), round_.model_dump()],
            "usage": usage.as_dict(),
        }

    async def revise(self, state: CriticState, runtime: Runtime[Context]) -> Update:
        """Feed the critique back and let the backbone rewrite the step."""
        ctx = self.kit.settings(runtime)
        texts, index = position(state)
        *earlier, latest = state["critiques"]
        analysis = analysis_of(latest["critique"]) or "The step has an error."
        fmt = ctx.step_style
        messages = [
            *conversation(state["question"], state.get("system_prompt"), fmt),
            AIMessage(fmt.solution([*texts, latest["step"]])),
            HumanMessage(CRITIC_FEEDBACK.format(analysis=analysis)),
            AIMessage(fmt.prefix(texts, index)),
        ]
        revision, reply = await self.rewrite_step(messages, index, ctx)
        revised = CriticRound.model_validate(
            {**latest, "revised": True, "revision": revision["text"]}
        )
        return {
            "kept": revision,
            "critiques": [*earlier, revised.model_dump()],
            "usage": reply.usage("backbone").as_dict(),
        }

    async def after_revise(self, state: CriticState, runtime: Runtime[Context]) -> str:
        rounds_done = len(state["critiques"])
        return "critique" if rounds_done < self.kit.settings(runtime).critic_rounds else "record"


async def after_critique(state: CriticState) -> str:
    return "record" if state["critiques"][-1]["verdict"] is True else "revise"


async def record(state: CriticState) -> Update:
    rounds = [CriticRound.model_validate(r) for r in state["critiques"]]
    return {
        "refine": CriticRecord(
            strategy="critic",
            draft=CandidateSummary.of(state["draft"]),
            rounds=rounds,
            revised=any(r.revised for r in rounds),
        ).as_dict()
    }


STRATEGY = Strategy("critic", CriticState, CriticNodes, CriticRecord, "LLM as a critic")
