"""LLM as a critic: the external model judges the flagged step; unless it says Yes, its
analysis goes back to the backbone, which rewrites the step (`critic_rounds` rounds)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START
from langgraph.runtime import Runtime
from pydantic import BaseModel, model_serializer

from graphs.refine.base import (
    CandidateSummary,
    ContextOf,
    RefineRecord,
    Strategy,
    Update,
    kept_texts,
    new_graph,
    single_step_turn,
    step_index,
)
from graphs.state import Context, RefineInput, RefineOutput
from nodes.draft import StepCandidate, conversation, sample_steps
from nodes.judge import analysis_of, judge_step
from nodes.llm import add_usage
from prompts.mur import CRITIC_FEEDBACK


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
        data = handler(self)
        if self.revision is None:
            data.pop("revision", None)
        return data


class CriticRecord(RefineRecord):
    strategy: Literal["critic"]
    rounds: list[CriticRound]
    revised: bool

    def summary(self) -> str:
        return "revised" if self.revised else "judged correct"


class CriticState(RefineInput, RefineOutput):
    """Scratch space; only `kept`, `refine` and `usage` go back to the loop."""

    usage: Annotated[dict[str, int], add_usage]
    critiques: list[dict[str, Any]]  # CriticRound dicts, the latest last


def build(backbone: BaseChatModel, verifier: BaseChatModel, context_of: ContextOf):
    async def critique(state: CriticState, runtime: Runtime[Context]) -> Update:
        """The external model judges the current version of the step."""
        ctx = context_of(runtime)
        current: StepCandidate = state.get("kept") or state["draft"]
        judgement, usage = await judge_step(
            verifier,
            question=state["question"],
            kept_texts=kept_texts(state),
            index=step_index(state),
            paragraph=current["text"],
            max_tokens=ctx.judge_max_tokens,
            force_verdict=ctx.judge_force_verdict,
        )
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

    async def revise(state: CriticState, runtime: Runtime[Context]) -> Update:
        """Feed the critique back and let the backbone rewrite the step."""
        ctx = context_of(runtime)
        texts, index = kept_texts(state), step_index(state)
        *earlier, latest = state["critiques"]
        analysis = analysis_of(latest["critique"]) or "The step has an error."
        fmt = ctx.step_style
        messages = [
            *conversation(state["question"], state.get("system_prompt"), fmt),
            AIMessage(fmt.solution([*texts, latest["step"]])),
            HumanMessage(CRITIC_FEEDBACK.format(analysis=analysis)),
            AIMessage(fmt.prefix(texts, index)),
        ]
        (revision,), reply = await sample_steps(
            backbone, messages, index=index, n=1, max_tokens=ctx.max_step_tokens, fmt=fmt
        )
        revised = CriticRound.model_validate(
            {**latest, "revised": True, "revision": revision["text"]}
        )
        return {
            "kept": single_step_turn(revision),
            "critiques": [*earlier, revised.model_dump()],
            "usage": reply.usage("backbone").as_dict(),
        }

    def after_critique(state: CriticState) -> str:
        return "record" if state["critiques"][-1]["verdict"] is True else "revise"

    def after_revise(state: CriticState, runtime: Runtime[Context]) -> str:
        rounds_done = len(state["critiques"])
        return "critique" if rounds_done < context_of(runtime).critic_rounds else "record"

    def record(state: CriticState) -> Update:
        rounds = [CriticRound.model_validate(r) for r in state["critiques"]]
        return {
            "refine": CriticRecord(
                strategy="critic",
                draft=CandidateSummary.of(state["draft"]),
                rounds=rounds,
                revised=any(r.revised for r in rounds),
            ).as_dict()
        }

    graph = new_graph(CriticState)
    graph.add_node("critique", critique)
    graph.add_node("revise", revise)
    graph.add_node("record", record)
    graph.add_edge(START, "critique")
    graph.add_conditional_edges("critique", after_critique, ["revise", "record"])
    graph.add_conditional_edges("revise", after_revise, ["critique", "record"])
    graph.add_edge("record", END)
    return graph.compile(name="refine_critic")


STRATEGY = Strategy("critic", build, CriticRecord)
