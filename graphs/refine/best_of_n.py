"""Guided search (best-of-N with a verifier): N candidates for the step, each judged in
context by the external model; the one with the highest P(Yes) is kept."""

from __future__ import annotations

from typing import Annotated, Literal

from langgraph.runtime import Runtime

from mur.graphs.refine.base import (
    CandidateNodes,
    CandidateSummary,
    Context,
    Kit,
    RefineGraph,
    RefineInput,
    RefineOutput,
    RefineRecord,
    Strategy,
    Update,
    candidate_graph,
    kept_texts,
    step_index,
)
from mur.nodes.draft import StepCandidate
from mur.nodes.judge import Judgement, judge_step
from mur.nodes.llm import gather_all
from mur.nodes.select import argmax_first
from mur.nodes.usage import Usage, add_usage


class JudgedCandidate(CandidateSummary):
    score: float  # P(Yes) of the judgement token
    verdict: bool | None
    judgement: str


class BestOfNRecord(RefineRecord):
    strategy: Literal["best_of_n"]
    candidates: list[JudgedCandidate]
    chosen: int
    reused_draft: bool

    def summary(self) -> str:
        return f"chose {self.chosen + 1} of {len(self.candidates)}"


class BestOfNState(RefineInput, RefineOutput):
    """Scratch space; only `kept`, `refine` and `usage` go back to the loop."""

    usage: Annotated[dict[str, int], add_usage]
    candidates: list[StepCandidate]
    judgements: list[Judgement]


class BestOfNNodes(CandidateNodes):
    """Best-of-N's nodes over the injected models: N backbone candidates, verifier judgements."""

    async def verify_candidates(self, state: BestOfNState, runtime: Runtime[Context]) -> Update:
        """The external model judges every candidate in context, concurrently."""
        ctx = self.kit.settings(runtime)
        texts, index = kept_texts(state), step_index(state)
        results = await gather_all(
            *(
                judge_step(
                    self.kit.verifier,
                    question=state["question"],
                    kept_texts=texts,
                    index=index,
                    paragraph=candidate["text"],
                    max_tokens=ctx.judge_max_tokens,
                    force_verdict=ctx.judge_force_verdict,
                )
                for candidate in state["candidates"]
            )
        )
        usage = sum((usage for _, usage in results), Usage())
        return {
            "judgements": [judgement for judgement, _ in results],
            "usage": usage.as_dict(),
        }

    def choose(self, state: BestOfNState, runtime: Runtime[Context]) -> Update:
        """Keep the candidate with the highest P(Yes); ties go to the first."""
        candidates, judgements = state["candidates"], state["judgements"]
        scores = [judgement["p_yes"] for judgement in judgements]
        chosen = argmax_first(scores)
        record = BestOfNRecord(
            strategy="best_of_n",
            draft=CandidateSummary.of(state["draft"]),
            candidates=[
                JudgedCandidate(
                    **CandidateSummary.of(c).model_dump(),
                    score=s,
                    verdict=j["verdict"],
                    judgement=j["text"],
                )
                for c, s, j in zip(candidates, scores, judgements, strict=True)
            ],
            chosen=chosen,
            reused_draft=self.kit.settings(runtime).reuse_draft,
        )
        return {"kept": candidates[chosen], "refine": record.as_dict()}


def build(kit: Kit) -> RefineGraph:
    nodes = BestOfNNodes(kit)
    score = ("verify_candidates", nodes.verify_candidates)
    return candidate_graph(nodes, BestOfNState, score, nodes.choose, "refine_best_of_n")


STRATEGY = Strategy("best_of_n", build, BestOfNRecord)
