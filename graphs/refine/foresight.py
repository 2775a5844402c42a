"""phi-Decoding foresight: N candidates, each rolled forward; the step is drawn by weights
that mix the rollouts' mean logprob with the size of their TF-IDF cluster."""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime

from mur.graphs.refine.base import CandidateSummary, ChoiceRecord, Context, Update, position
from mur.graphs.refine.kit import CandidateNodes, Scratch, Strategy
from mur.nodes.draft import StepCandidate, contains_answer, conversation
from mur.nodes.gates import derive_seed, question_seed
from mur.nodes.llm import Request, gather_all, generate
from mur.nodes.select import (
    argmax_first,
    cluster_labels,
    foresight_weights,
    mean_logprob,
    sample_index,
)
from mur.nodes.usage import Usage


class ForesightCandidate(CandidateSummary):
    rollout: str
    rollout_tokens: int
    score: float  # the rollout's mean logprob
    cluster: int
    weight: float


class ForesightRecord(ChoiceRecord):
    strategy: Literal["foresight"]
    candidates: list[ForesightCandidate]
    selection: Literal["sample", "argmax"]
    reused_draft: bool


class ForesightState(Scratch):
    """Foresight's scratch: the candidates, and a rollout of each."""

    candidates: list[StepCandidate]
    rollouts: list[dict[str, Any]]  # text, logprobs, num_tokens, one per candidate


def foresight_score(candidate: StepCandidate, rollout: dict[str, Any]) -> float:
    """The rollout's mean logprob; a candidate with nothing to roll out (it ends the solution,
    or the rollout came back empty) is scored by its own tokens, so candidates stay aligned."""
    if rollout["logprobs"]:
        return mean_logprob(rollout["logprobs"])
    if candidate["logprobs"]:
        return mean_logprob(candidate["logprobs"])
    return float("-inf")


class ForesightNodes(CandidateNodes):
    """Foresight's nodes over the injected backbone: N candidates, a rollout of each."""

    score_node = "foresee"

    async def score(self, state: ForesightState, runtime: Runtime[Context]) -> Update:
        """Foresee: roll each candidate forward; its score is the rollout's mean logprob."""
        ctx = self.kit.settings(runtime)
        texts, index = position(state)
        steps_ahead = ctx.foresight_steps or max(ctx.max_steps - index, 1)
        fmt = ctx.step_style

        async def roll(candidate: StepCandidate) -> tuple[dict[str, Any], Usage]:
            if contains_answer(candidate["text"]) or candidate["ended_by_model"]:
                return {"text": "", "logprobs": [], "num_tokens": 0}, Usage()
            request = Request(
                messages=[
                    *conversation(state["question"], state.get("system_prompt"), fmt),
                    AIMessage(fmt.prefix([*texts, candidate["text"]], index + 1)),
                ],
                max_tokens=ctx.max_step_tokens * steps_ahead,
                stop=fmt.rollout_stops(index, ctx.foresight_steps),
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )
            reply = await generate(self.kit.backbone, request)
            choice = reply.choices[0]
            rollout = {
                "text": choice.text.strip(),
                "logprobs": list(choice.logprobs),
                "num_tokens": choice.num_tokens,
            }
            return rollout, reply.usage("backbone")

        results = await gather_all(*(roll(c) for c in state["candidates"]))
        usage = sum((spent for _, spent in results), Usage())
        return {"rollouts": [rollout for rollout, _ in results], "usage": usage.as_dict()}

    async def choose(self, state: ForesightState, runtime: Runtime[Context]) -> Update:
        """Weights from rollout scores and cluster sizes; a seeded draw or the argmax."""
        ctx = self.kit.settings(runtime)
        candidates, rollouts = state["candidates"], state["rollouts"]
        pairs = list(zip(candidates, rollouts, strict=True))
        scores = [foresight_score(c, r) for c, r in pairs]
        labels = cluster_labels(
            [f"{c['text']} {r['text']}".strip() for c, r in pairs], seed=ctx.seed
        )
        weights = foresight_weights(scores, labels)
        if ctx.foresight_selection == "argmax":
            chosen = argmax_first(weights)
        else:
            seed = question_seed(ctx.seed, state["question"])
            _, index = position(state)
            chosen = sample_index(weights, derive_seed(seed, index))
        record = ForesightRecord(
            strategy="foresight",
            draft=CandidateSummary.of(state["draft"]),
            candidates=[
                ForesightCandidate(
                    **CandidateSummary.of(c).model_dump(),
                    rollout=r["text"],
                    rollout_tokens=r["num_tokens"],
                    score=s,
                    cluster=label,
                    weight=w,
                )
                for (c, r), s, label, w in zip(pairs, scores, labels, weights, strict=True)
            ],
            chosen=chosen,
            selection=ctx.foresight_selection,
            reused_draft=ctx.reuse_draft,
        )
        return {"kept": candidates[chosen], "refine": record.as_dict()}


STRATEGY = Strategy(
    "foresight",
    ForesightState,
    ForesightNodes,
    ForesightRecord,
    "lookahead",
    uses_verifier=False,
    extra="lab",  # scikit-learn clusters the rollouts (nodes.select)
)
