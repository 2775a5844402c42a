"""Guided search (best-of-N with a verifier): N candidates for the step, each judged in
context by the external model; the one with the highest P(Yes) is kept."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime

from mur.graphs.refine.base import CandidateSummary, ChoiceRecord, Context, Update
from mur.graphs.refine.kit import CandidateNodes, Scratch, Strategy
from mur.nodes.draft import StepCandidate
from mur.nodes.judge import Judgement
from mur.nodes.llm import gather_all
from mur.nodes.select import argmax_first
from mur.nodes.usage import Usage


class JudgedCandidate(CandidateSummary):
    score: float  # P(Yes) of the judgement token
    verdict: bool | None
    judgement: str


class BestOfNRecord(ChoiceRecord):
    strategy: Literal["best_of_n"]
    candidates: list[JudgedCandidate]
    reused_draft: bool


class BestOfNState(Scratch):
    """Best-of-N's scratch: the candidates, and the verifier's judgement of each."""

    candidates: list[StepCandidate]
    judgements: list[Judgement]


class BestOfNNodes(CandidateNodes):
    """Best-of-N's nodes over the injected models: N backbone candidates, verifier judgements."""

    score_node = "verify_candidates"

    async def score(self, state: BestOfNState, runtime: Runtime[Context]) -> Update:
        """The external model judges every candidate in context, concurrently."""
        results = await gather_all(
            *(self.judge(state, candidate["text"], runtime) for candidate in state["candidates"])
        )
        usage = sum((usage for _, usage in results), Usage())
        return {
            "judgements": [judgement for judgement, _ in results],
            "usage": usage.as_dict(),
        }

    async def choose(self, state: BestOfNState, runtime: Runtime[Context]) -> Update:
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


STRATEGY = Strategy("best_of_n", BestOfNState, BestOfNNodes, BestOfNRecord, "guided search")
