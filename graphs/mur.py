"""The MUR reasoning loop, assembled in one place:

    draft_step -> score_uncertainty -> gamma_gate -> [refine] -> commit_step -> done?
                                                                   |-> draft_step (next step)
                                                                   |-> ask_answer (max_steps)
                                                                   '-> finalize

A request that no longer fits the model's context ends the solution (finish_reason
"context_length"): a draft that overflows goes to finalize (or to ask_answer when the server
said enough room is left for a short answer), a refine that overflows keeps the draft.

`build_graph(strategy, gate, backbone=..., verifier=...)` returns the compiled graph; models are
injected (any LangChain chat model that returns OpenAI-format token logprobs), defaulting to
clients of the servers configured in `servers/`.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import RetryPolicy

from graphs.attempts import AttemptLedger
from graphs.refine import check_strategy
from graphs.state import Context, InputState, OutputState, State, StepRecord
from nodes.answer import extract_answer
from nodes.budget import budget_margin
from nodes.draft import (
    answer_fallback,
    check_question,
    contains_answer,
    sample_steps,
    step_messages,
)
from nodes.gates import GateHistory, decide
from nodes.llm import ContextOverflowError, is_transient
from nodes.uncertainty import step_confidence, step_uncertainty, update_momentum

Update = dict[str, Any]
SPENT_KEYS = ("backbone_tokens", "external_tokens")

# Transient server faults (connection resets, 5xx, timeouts) are retried on model-calling
# nodes; anything else (bad request, missing logprobs) fails at once with its own message.
# The only retry loop: the clients' own retries are off (servers.clients).
MODEL_RETRY = RetryPolicy(
    max_attempts=3,
    initial_interval=1.0,
    backoff_factor=2.0,
    max_interval=30.0,
    retry_on=is_transient,
)

# After a draft overflowed: the answer request's prompt is the draft's with the answer cue in
# place of the step marker (a few tokens longer), and fewer tokens than this answer nothing.
FALLBACK_MARGIN_TOKENS = 16
FALLBACK_MIN_TOKENS = 16


def _context_full(overflow: ContextOverflowError) -> Update:
    """End the solution: the context has no room for another step."""
    room = overflow.room
    answer_room = room - FALLBACK_MARGIN_TOKENS if room is not None else None
    if answer_room is not None and answer_room < FALLBACK_MIN_TOKENS:
        answer_room = None
    return {"done": True, "finish_reason": "context_length", "answer_room": answer_room}


def _kept_texts(state: State) -> list[str]:
    return [step["text"] for step in state.get("steps", [])]


def build_graph(
    strategy: str = "critic",
    gate: str = "mur",
    *,
    backbone: BaseChatModel | None = None,
    verifier: BaseChatModel | None = None,
    checkpointer: Any = None,
) -> CompiledStateGraph:
    """Compile the MUR graph for one refine strategy.

    `gate` is the default of a run that passes no context; a run picks any gate and setting
    with `context=Context(...)` (or a dict of them: LangGraph validates it into a Context).
    The verifier defaults to the backbone.
    """
    refine_strategy = check_strategy(strategy)
    defaults = Context(gate=gate)
    if backbone is None:
        backbone, default_verifier = default_models()
        verifier = verifier or default_verifier
    verifier = verifier or backbone

    def context_of(runtime: Runtime[Context]) -> Context:
        return runtime.context or defaults

    async def draft_step(state: State, runtime: Runtime[Context]) -> Update:
        """Continue the kept steps with step t (stops at the next step marker)."""
        ctx = context_of(runtime)
        kept = _kept_texts(state)
        index = len(kept) + 1
        if index == 1:
            check_question(state["question"])
        fmt = ctx.step_style
        messages = step_messages(state["question"], state.get("system_prompt"), kept, index, fmt)
        try:
            (draft,), reply = await sample_steps(
                backbone, messages, index=index, n=1, max_tokens=ctx.max_step_tokens, fmt=fmt
            )
        except ContextOverflowError as overflow:
            return {**_context_full(overflow), "draft": None}
        return {
            "draft": draft,
            "kept": None,
            "refine": None,
            "gate": None,
            "usage": reply.usage("backbone").as_dict(),
        }

    def score_uncertainty(state: State) -> Update:
        """m_t (mean -logprob) and the mean token probability of the draft."""
        draft = state["draft"]
        if draft["num_tokens"] == 0:
            # Nothing was generated: the solution is over, there is nothing to score.
            return {"done": True, "finish_reason": "empty_step"}
        return {
            "gate": {
                "uncertainty": step_uncertainty(draft["logprobs"]),
                "confidence": step_confidence(draft["logprobs"]),
                "threshold": None,
                "scale": False,
            }
        }

    def gamma_gate(state: State, runtime: Runtime[Context]) -> Update:
        """Decide whether this step deserves the expensive strategy."""
        ctx = context_of(runtime)
        steps = state.get("steps", [])
        record = state["gate"]
        decision = decide(
            ctx.gate,
            step=len(steps) + 1,
            uncertainty=record["uncertainty"],
            confidence=record["confidence"],
            history=GateHistory(
                momentum=state.get("momentum", 0.0),
                kept_uncertainties=[step["uncertainty"] for step in steps],
            ),
            params=ctx.gate_params(
                state["question"],
                budget_margin(
                    steps,
                    spent_tokens=sum(state.get("usage", {}).get(k, 0) for k in SPENT_KEYS),
                    draft_tokens=state["draft"]["num_tokens"],
                    settings=ctx.budget_settings(),
                )
                if ctx.budget_mode
                else None,
            ),
        )
        return {"gate": {**record, "threshold": decision.threshold, "scale": decision.scale}}

    def route_draft(state: State) -> str:
        if not state.get("done"):
            return "score_uncertainty"
        return "ask_answer" if state.get("answer_room") else "finalize"

    def route_score(state: State) -> str:
        return "finalize" if state.get("done") else "gamma_gate"

    def route_gate(state: State) -> str:
        return "refine" if state["gate"]["scale"] else "commit_step"

    def commit_step(state: State, runtime: Runtime[Context]) -> Update:
        """Keep the step (refined or not), update the momentum with its uncertainty."""
        ctx = context_of(runtime)
        scaled = state["gate"]["scale"]
        kept = state.get("kept") if scaled else None
        if kept is None or kept["num_tokens"] == 0:
            kept = state["draft"]
        uncertainty = step_uncertainty(kept["logprobs"])
        before = state.get("momentum", 0.0)
        after = update_momentum(before, uncertainty, ctx.alpha)
        index = len(state.get("steps", [])) + 1
        record = StepRecord(
            index=index,
            text=kept["text"],
            uncertainty=uncertainty,
            confidence=step_confidence(kept["logprobs"]),
            momentum_before=before,
            momentum_after=after,
            scaled=scaled,
            strategy=strategy if scaled else None,
            num_tokens=kept["num_tokens"],
            refine=state.get("refine") if scaled else None,
        )
        runtime.stream_writer(
            {
                "event": "step",
                **record,
                "draft_uncertainty": state["gate"]["uncertainty"],
                "threshold": state["gate"]["threshold"],
                "logprobs": kept["logprobs"],
            }
        )
        update: Update = {"steps": [record], "momentum": after}
        if contains_answer(kept["text"]):
            update.update(done=True, finish_reason="answer")
        elif kept["ended_by_model"]:
            update.update(done=True, finish_reason="end_of_sequence")
        elif kept["finish_reason"] == "length" and kept["num_tokens"] < ctx.max_step_tokens:
            # Cut before its cap: the server stopped at the end of the context (vLLM shortens
            # max_tokens to the room left), so the next request could not fit.
            update.update(done=True, finish_reason="context_length")
        return update

    def route_commit(state: State, runtime: Runtime[Context]) -> str:
        if state.get("done"):
            return "finalize"
        if len(state["steps"]) >= context_of(runtime).max_steps:
            return "ask_answer"
        return "draft_step"

    async def ask_answer(state: State, runtime: Runtime[Context]) -> Update:
        """After max_steps, or a draft that overflowed the context with room left: one
        continuation (capped by that room) that asks for the answer."""
        ctx = context_of(runtime)
        room = state.get("answer_room")
        reason = "context_length" if room else "max_steps"
        try:
            text, num_tokens, reply = await answer_fallback(
                backbone,
                state["question"],
                state.get("system_prompt"),
                _kept_texts(state),
                max_tokens=min(ctx.max_step_tokens, room) if room else ctx.max_step_tokens,
                fmt=ctx.step_style,
            )
        except ContextOverflowError:
            return {"fallback": None, "finish_reason": "context_length"}
        return {
            "fallback": {"text": text, "num_tokens": num_tokens},
            "finish_reason": reason,
            "usage": reply.usage("backbone").as_dict(),
        }

    def finalize(state: State, runtime: Runtime[Context]) -> Update:
        """The answer: the text after the last 'the answer is' (or the last boxed)."""
        fallback = state.get("fallback")
        texts = [*_kept_texts(state), fallback["text"] if fallback else ""]
        return {
            "answer": extract_answer("\n".join(texts)),
            "fallback": fallback,
            "finish_reason": state.get("finish_reason"),
            "config": {"strategy": strategy, **context_of(runtime).as_dict()},
        }

    strategy_graph = refine_strategy.build(backbone, verifier, context_of)

    async def refine(state: State, runtime: Runtime[Context]) -> Update:
        """The strategy's subgraph; when one of its requests overflows the context, the draft
        is kept as the step and the solution ends."""
        try:
            return await strategy_graph.ainvoke(state, context=runtime.context)
        except ContextOverflowError as overflow:
            return {
                "kept": None,
                "refine": {"strategy": strategy, "context_length": str(overflow)},
                "done": True,
                "finish_reason": "context_length",
            }

    counted = AttemptLedger(MODEL_RETRY).counted
    graph = StateGraph(
        State, context_schema=Context, input_schema=InputState, output_schema=OutputState
    )
    graph.add_node("draft_step", counted(draft_step), retry_policy=MODEL_RETRY)
    graph.add_node("score_uncertainty", score_uncertainty)
    graph.add_node("gamma_gate", gamma_gate)
    graph.add_node("refine", counted(refine), retry_policy=MODEL_RETRY)
    graph.add_node("commit_step", commit_step)
    graph.add_node("ask_answer", counted(ask_answer), retry_policy=MODEL_RETRY)
    graph.add_node("finalize", finalize)

    graph.add_edge(START, "draft_step")
    graph.add_conditional_edges(
        "draft_step", route_draft, ["score_uncertainty", "ask_answer", "finalize"]
    )
    graph.add_conditional_edges("score_uncertainty", route_score, ["gamma_gate", "finalize"])
    graph.add_conditional_edges("gamma_gate", route_gate, ["refine", "commit_step"])
    graph.add_edge("refine", "commit_step")
    graph.add_conditional_edges(
        "commit_step", route_commit, ["draft_step", "ask_answer", "finalize"]
    )
    graph.add_edge("ask_answer", "finalize")
    graph.add_edge("finalize", END)
    return graph.compile(checkpointer=checkpointer, name=f"mur_{strategy}")


def default_models() -> tuple[BaseChatModel, BaseChatModel]:
    """Clients of the default endpoints (env MUR_BASE_URL etc., else the embedded CPU server).

    Nothing is started or probed when the model names are known: a graph compiled at import
    (LangGraph Studio) must not need a running server.
    """
    from servers.connect import connect  # the serving layer, only when no model is injected

    connection = connect(probe=False)
    return connection.backbone, connection.verifier
