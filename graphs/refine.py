"""One refine subgraph per strategy: what "scale this step" means.

Each subgraph reads the question, the kept steps and the flagged draft, and hands back the step
to keep, a record of what it did, and the tokens it spent. Adding a strategy means adding a
builder to REFINE_BUILDERS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime

from graphs.state import Context, RefineInput, RefineOutput, RefineState
from nodes.draft import (
    StepCandidate,
    contains_answer,
    conversation,
    marker,
    sample_steps,
    solution_text,
    step_messages,
    step_prefix,
)
from nodes.gates import derive_seed
from nodes.judge import analysis_of, judge_step
from nodes.llm import Request, Usage, gather_all, generate
from nodes.select import (
    argmax_first,
    cluster_labels,
    foresight_weights,
    mean_logprob,
    sample_index,
)
from nodes.thinking import THINKING_ON, think, think_block, thinking_conversation
from nodes.uncertainty import step_uncertainty
from prompts.mur import CRITIC_FEEDBACK

ContextOf = Callable[[Runtime[Context]], Context]
Update = dict[str, Any]


def _kept_texts(state: RefineState) -> list[str]:
    return [step["text"] for step in state["steps"]]


def _index(state: RefineState) -> int:
    return len(state["steps"]) + 1


def _summary(candidate: StepCandidate) -> dict[str, Any]:
    """A candidate as refine records show it."""
    return {
        "text": candidate["text"],
        "uncertainty": step_uncertainty(candidate["logprobs"]) if candidate["logprobs"] else None,
        "num_tokens": candidate["num_tokens"],
    }


def _single_step_turn(candidate: StepCandidate) -> StepCandidate:
    """A step written in a side turn that asked for that one step (a revision after feedback,
    a step after thinking): the model ending that turn ends the step, not the solution."""
    return {**candidate, "ended_by_model": False}


def _new_graph() -> StateGraph:
    return StateGraph(
        RefineState,
        context_schema=Context,
        input_schema=RefineInput,
        output_schema=RefineOutput,
    )


# --- shared by best_of_n and foresight -------------------------------------------------------


def _sample_candidates_node(backbone: BaseChatModel, context_of: ContextOf):
    async def sample_candidates(state: RefineState, runtime: Runtime[Context]) -> Update:
        """Sample N candidates for the step in one request: the paper discards the draft;
        with `reuse_draft` the draft (a sample from the same policy) is candidate 0."""
        ctx = context_of(runtime)
        index = _index(state)
        reused = [state["draft"]] if ctx.reuse_draft else []
        if ctx.num_candidates - len(reused) < 1:
            return {"candidates": reused}
        messages = step_messages(
            state["question"], state.get("system_prompt"), _kept_texts(state), index
        )
        candidates, reply = await sample_steps(
            backbone,
            messages,
            index=index,
            n=ctx.num_candidates - len(reused),
            max_tokens=ctx.max_step_tokens,
        )
        return {"candidates": reused + candidates, "usage": reply.usage("backbone").as_dict()}

    return sample_candidates


# --- critic ----------------------------------------------------------------------------------


def build_critic(backbone: BaseChatModel, verifier: BaseChatModel, context_of: ContextOf):
    async def critique(state: RefineState, runtime: Runtime[Context]) -> Update:
        """The external model judges the current version of the step."""
        ctx = context_of(runtime)
        current = state.get("kept") or state["draft"]
        judgement, reply = await judge_step(
            verifier,
            question=state["question"],
            kept_texts=_kept_texts(state),
            index=_index(state),
            paragraph=current["text"],
            max_tokens=ctx.judge_max_tokens,
        )
        round_record = {
            "step": current["text"],
            "critique": judgement["text"],
            "verdict": judgement["verdict"],
            "num_tokens": judgement["num_tokens"],
            "revised": False,
        }
        return {
            "kept": current,
            "critiques": [*state.get("critiques", []), round_record],
            "usage": reply.usage("external").as_dict(),
        }

    async def revise(state: RefineState, runtime: Runtime[Context]) -> Update:
        """Feed the critique back and let the backbone rewrite the step."""
        ctx = context_of(runtime)
        kept_texts, index = _kept_texts(state), _index(state)
        *earlier, latest = state["critiques"]
        analysis = analysis_of(latest["critique"]) or "The step has an error."
        messages = [
            *conversation(state["question"], state.get("system_prompt")),
            AIMessage(solution_text([*kept_texts, latest["step"]])),
            HumanMessage(CRITIC_FEEDBACK.format(analysis=analysis)),
            AIMessage(step_prefix(kept_texts, index)),
        ]
        (revision,), reply = await sample_steps(
            backbone, messages, index=index, n=1, max_tokens=ctx.max_step_tokens
        )
        revised = {**latest, "revised": True, "revision": revision["text"]}
        return {
            "kept": _single_step_turn(revision),
            "critiques": [*earlier, revised],
            "usage": reply.usage("backbone").as_dict(),
        }

    def after_critique(state: RefineState) -> str:
        return "record" if state["critiques"][-1]["verdict"] is True else "revise"

    def after_revise(state: RefineState, runtime: Runtime[Context]) -> str:
        rounds_done = len(state["critiques"])
        return "critique" if rounds_done < context_of(runtime).critic_rounds else "record"

    def record(state: RefineState) -> Update:
        rounds = state["critiques"]
        return {
            "refine": {
                "strategy": "critic",
                "draft": _summary(state["draft"]),
                "rounds": rounds,
                "revised": any(r["revised"] for r in rounds),
            }
        }

    graph = _new_graph()
    graph.add_node("critique", critique)
    graph.add_node("revise", revise)
    graph.add_node("record", record)
    graph.add_edge(START, "critique")
    graph.add_conditional_edges("critique", after_critique, ["revise", "record"])
    graph.add_conditional_edges("revise", after_revise, ["critique", "record"])
    graph.add_edge("record", END)
    return graph.compile(name="refine_critic")


# --- best-of-N with a verifier ---------------------------------------------------------------


def build_best_of_n(backbone: BaseChatModel, verifier: BaseChatModel, context_of: ContextOf):
    async def verify_candidates(state: RefineState, runtime: Runtime[Context]) -> Update:
        """The external model judges every candidate in context, concurrently."""
        ctx = context_of(runtime)
        kept_texts, index = _kept_texts(state), _index(state)
        results = await gather_all(
            *(
                judge_step(
                    verifier,
                    question=state["question"],
                    kept_texts=kept_texts,
                    index=index,
                    paragraph=candidate["text"],
                    max_tokens=ctx.judge_max_tokens,
                )
                for candidate in state["candidates"]
            )
        )
        usage = sum((reply.usage("external") for _, reply in results), Usage())
        return {
            "judgements": [judgement for judgement, _ in results],
            "usage": usage.as_dict(),
        }

    def choose(state: RefineState, runtime: Runtime[Context]) -> Update:
        """Keep the candidate with the highest P(Yes); ties go to the first."""
        scores = [judgement["p_yes"] for judgement in state["judgements"]]
        chosen = argmax_first(scores)
        return {
            "kept": state["candidates"][chosen],
            "refine": {
                "strategy": "best_of_n",
                "draft": _summary(state["draft"]),
                "candidates": [
                    {**_summary(c), "score": s, "verdict": j["verdict"], "judgement": j["text"]}
                    for c, s, j in zip(
                        state["candidates"], scores, state["judgements"], strict=True
                    )
                ],
                "chosen": chosen,
                "reused_draft": context_of(runtime).reuse_draft,
            },
        }

    graph = _new_graph()
    graph.add_node("sample_candidates", _sample_candidates_node(backbone, context_of))
    graph.add_node("verify_candidates", verify_candidates)
    graph.add_node("choose", choose)
    graph.add_edge(START, "sample_candidates")
    graph.add_edge("sample_candidates", "verify_candidates")
    graph.add_edge("verify_candidates", "choose")
    graph.add_edge("choose", END)
    return graph.compile(name="refine_best_of_n")


# --- phi-Decoding foresight ------------------------------------------------------------------


def rollout_stops(index: int, foresight_steps: int) -> list[str] | None:
    """A rollout of k steps after step `index` ends where step index + k + 1 would begin."""
    if foresight_steps == 0:
        return None
    nxt = index + foresight_steps + 1
    return [f"\n{marker(nxt)}", marker(nxt)]


def build_foresight(backbone: BaseChatModel, verifier: BaseChatModel, context_of: ContextOf):
    async def foresee(state: RefineState, runtime: Runtime[Context]) -> Update:
        """Roll each candidate forward; its score is the rollout's mean logprob."""
        ctx = context_of(runtime)
        kept_texts, index = _kept_texts(state), _index(state)
        steps_ahead = ctx.foresight_steps or max(ctx.max_steps - index, 1)

        async def roll(candidate: StepCandidate) -> dict[str, Any]:
            if contains_answer(candidate["text"]) or candidate["ended_by_model"]:
                return {"text": "", "logprobs": [], "num_tokens": 0, "usage": Usage()}
            request = Request(
                messages=[
                    *conversation(state["question"], state.get("system_prompt")),
                    AIMessage(step_prefix([*kept_texts, candidate["text"]], index + 1)),
                ],
                max_tokens=ctx.max_step_tokens * steps_ahead,
                stop=rollout_stops(index, ctx.foresight_steps),
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )
            reply = await generate(backbone, request)
            choice = reply.choices[0]
            return {
                "text": choice.text.strip(),
                "logprobs": list(choice.logprobs),
                "num_tokens": choice.num_tokens,
                "usage": reply.usage("backbone"),
            }

        rollouts = await gather_all(*(roll(c) for c in state["candidates"]))
        usage = sum((rollout.pop("usage") for rollout in rollouts), Usage())
        return {"rollouts": list(rollouts), "usage": usage.as_dict()}

    def choose(state: RefineState, runtime: Runtime[Context]) -> Update:
        """Weights from rollout scores and cluster sizes; a seeded draw or the argmax."""
        ctx = context_of(runtime)
        candidates, rollouts = state["candidates"], state["rollouts"]
        scores = [foresight_score(c, r) for c, r in zip(candidates, rollouts, strict=True)]
        labels = cluster_labels(
            [f"{c['text']} {r['text']}".strip() for c, r in zip(candidates, rollouts, strict=True)],
            seed=ctx.seed,
        )
        weights = foresight_weights(scores, labels)
        if ctx.foresight_selection == "argmax":
            chosen = argmax_first(weights)
        else:
            chosen = sample_index(weights, derive_seed(ctx.seed, _index(state)))
        return {
            "kept": candidates[chosen],
            "refine": {
                "strategy": "foresight",
                "draft": _summary(state["draft"]),
                "candidates": [
                    {
                        **_summary(c),
                        "rollout": r["text"],
                        "rollout_tokens": r["num_tokens"],
                        "score": s,
                        "cluster": label,
                        "weight": w,
                    }
                    for c, r, s, label, w in zip(
                        candidates, rollouts, scores, labels, weights, strict=True
                    )
                ],
                "chosen": chosen,
                "selection": ctx.foresight_selection,
                "reused_draft": ctx.reuse_draft,
            },
        }

    graph = _new_graph()
    graph.add_node("sample_candidates", _sample_candidates_node(backbone, context_of))
    graph.add_node("foresee", foresee)
    graph.add_node("choose", choose)
    graph.add_edge(START, "sample_candidates")
    graph.add_edge("sample_candidates", "foresee")
    graph.add_edge("foresee", "choose")
    graph.add_edge("choose", END)
    return graph.compile(name="refine_foresight")


def foresight_score(candidate: StepCandidate, rollout: dict[str, Any]) -> float:
    """The rollout's mean logprob; a candidate with nothing to roll out (it ends the solution,
    or the rollout came back empty) is scored by its own tokens, so candidates stay aligned."""
    if rollout["logprobs"]:
        return mean_logprob(rollout["logprobs"])
    if candidate["logprobs"]:
        return mean_logprob(candidate["logprobs"])
    return float("-inf")


# --- thinking switch -------------------------------------------------------------------------


def build_thinking(backbone: BaseChatModel, verifier: BaseChatModel, context_of: ContextOf):
    async def think_about_step(state: RefineState, runtime: Runtime[Context]) -> Update:
        """Think (capped at thinking_budget, whole sentences kept) about the flagged step."""
        ctx = context_of(runtime)
        conv = thinking_conversation(
            state["question"], state.get("system_prompt"), _kept_texts(state), _index(state)
        )
        thought, capped, num_tokens, reply = await think(
            backbone, conv, style=ctx.thinking_style, budget=ctx.thinking_budget
        )
        return {
            "thought": {"text": thought, "capped": capped, "num_tokens": num_tokens},
            "usage": reply.usage("backbone").as_dict(),
        }

    async def write_step(state: RefineState, runtime: Runtime[Context]) -> Update:
        """Write the step after the closed think block; its uncertainty feeds the momentum."""
        ctx = context_of(runtime)
        kept_texts, index = _kept_texts(state), _index(state)
        conv = thinking_conversation(
            state["question"], state.get("system_prompt"), kept_texts, index
        )
        block = think_block(state["thought"]["text"], ctx.thinking_style)
        messages = [*conv, AIMessage(block + step_prefix(kept_texts, index))]
        (step,), reply = await sample_steps(
            backbone,
            messages,
            index=index,
            n=1,
            max_tokens=ctx.max_step_tokens,
            extra_body=THINKING_ON,
        )
        return {
            "kept": _single_step_turn(step),
            "refine": {
                "strategy": "thinking",
                "draft": _summary(state["draft"]),
                "thinking": state["thought"]["text"],
                "thinking_tokens": state["thought"]["num_tokens"],
                "capped": state["thought"]["capped"],
            },
            "usage": reply.usage("backbone").as_dict(),
        }

    graph = _new_graph()
    graph.add_node("think", think_about_step)
    graph.add_node("write_step", write_step)
    graph.add_edge(START, "think")
    graph.add_edge("think", "write_step")
    graph.add_edge("write_step", END)
    return graph.compile(name="refine_thinking")


REFINE_BUILDERS: dict[
    str, Callable[[BaseChatModel, BaseChatModel, ContextOf], CompiledStateGraph]
] = {
    "critic": build_critic,
    "best_of_n": build_best_of_n,
    "foresight": build_foresight,
    "thinking": build_thinking,
}
