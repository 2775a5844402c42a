"""The loop's nodes and routes: draft step t, score it, gate it, keep it, end the solution.

Pure nodes and routes are module functions; the two nodes that ask the backbone are methods
of `Drafting`, which holds the injected model. graphs/mur.py wires them with the strategies'
subgraphs. A run's settings are its Context (`settings_of`), the paper's when it passes none.
The pure nodes are `async def` though they never wait: an async graph hands a plain function
to a thread pool, a thread hop per node that a fast server makes a visible share of the
client's CPU (every node of the graphs here is async for that reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.runtime import Runtime

from mur.graphs.refine.base import kept_texts, run_settings, write_step
from mur.graphs.state import Context, GateRecord, State, StepRecord
from mur.nodes.answer import extract_answer
from mur.nodes.branching import BRANCH_RULES
from mur.nodes.budget import budget_margin
from mur.nodes.confidence import GroupWatch, token_confidence
from mur.nodes.draft import (
    StepCandidate,
    answer_fallback,
    check_question,
    contains_answer,
    entropy_spikes,
    sample_step_watched,
    step_messages,
)
from mur.nodes.gates import GateHistory, decide
from mur.nodes.llm import ABORTED, TokenWatch
from mur.nodes.trace_stop import STOP_RULES, should_stop
from mur.nodes.uncertainty import step_confidence, step_uncertainty, update_momentum
from mur.nodes.voting import TraceRules
from mur.servers.clients.transport_errors import ContextOverflow

Update = dict[str, Any]
SPENT_KEYS = ("backbone_tokens", "external_tokens")
DEFAULT_CONTEXT = Context()

# After a draft overflowed: the answer request's prompt is the draft's with the answer cue in
# place of the step marker (a few tokens longer), and fewer tokens than this answer nothing.
FALLBACK_MARGIN_TOKENS = 16
FALLBACK_MIN_TOKENS = 16


def settings_of(runtime: Runtime[Context]) -> Context:
    """The run's settings: its Context, or the paper's for a run that passes none."""
    return run_settings(runtime, DEFAULT_CONTEXT)


def trace_confidences(steps: Sequence[StepRecord]) -> list[float]:
    """The token confidences of a trace's kept steps, in order (empty when not recorded)."""
    return [c for step in steps for c in step.get("confidences", ())]


def stops_after(steps: Sequence[StepRecord], rules: TraceRules, threshold: float | None) -> bool:
    """The stop rule after the last of `steps` (commit_step asks it before the next step).
    The trace's confidences are gathered only for a rule that reads them: a report replays
    this after every step of thousands of traces, where gathering them was most of its time."""
    if not steps:
        return False
    reads = STOP_RULES[rules.trace_stop].reads_confidence
    return should_stop(
        rules,
        threshold,
        momentum=steps[-1]["momentum_after"],
        confidences=trace_confidences(steps) if reads else (),
    )


def drafted(state: State) -> StepCandidate:
    """Step t's draft, there on every route past draft_step (an overflow, which clears it,
    goes straight to the end)."""
    draft = state["draft"]
    assert draft is not None, "no draft past draft_step"
    return draft


def gated(state: State) -> GateRecord:
    """Step t's gate record, there on every route past score_uncertainty."""
    record = state["gate"]
    assert record is not None, "no gate record past score_uncertainty"
    return record


def confidence_watch(state: State, ctx: Context) -> TokenWatch | None:
    """DeepConf's online stop inside a step: for a trace after the warm-up under the
    confidence rule, a watch that says stop at the first token whose group (the window runs
    on from the kept steps' tokens) falls below the threshold; None otherwise."""
    threshold = state.get("stop_threshold")
    if not STOP_RULES[ctx.trace_stop].reads_confidence or threshold is None:
        return None
    group = GroupWatch(ctx.group_window)
    for confidence in trace_confidences(state.get("steps", []))[-ctx.group_window :]:
        group.push(confidence)  # the window runs on from the last kept tokens (all checked)

    def watch(top_logprobs: Sequence[float]) -> bool:
        current = group.push(token_confidence(top_logprobs))
        return current is not None and current < threshold

    return watch


class Drafting:
    """The loop's requests to the injected backbone: each step's draft, and the answer."""

    def __init__(self, backbone: BaseChatModel) -> None:
        self.backbone = backbone

    async def draft_step(self, state: State, runtime: Runtime[Context]) -> Update:
        """Continue the kept steps with step t (stops at the next step marker)."""
        ctx = settings_of(runtime)
        kept = kept_texts(state)
        index = len(kept) + 1
        if index == 1:
            check_question(state["question"])
        fmt = ctx.step_style
        partial = state.get("partial") or ""  # a branch that starts inside this step
        messages = step_messages(
            state["question"], state.get("system_prompt"), kept, index, fmt, partial
        )
        watch = confidence_watch(state, ctx)
        if watch is None:
            draft, reply = await write_step(self.backbone, messages, index, ctx)
        else:
            draft, reply = await sample_step_watched(
                self.backbone,
                messages,
                index=index,
                max_tokens=ctx.max_step_tokens,
                fmt=fmt,
                top_logprobs=ctx.top_logprobs,
                watch=watch,
            )
        if partial:
            draft = StepCandidate(**{**draft, "text": (partial + reply.choices[0].text).strip()})
        if BRANCH_RULES[ctx.branch].reads_entropy:
            draft["entropy_spikes"] = entropy_spikes(
                reply.choices[0], ctx.branch_entropy, before=partial
            )
        return {
            "draft": draft,
            "partial": None,
            "kept": None,
            "refine": None,
            "gate": None,
            "usage": reply.usage("backbone").as_dict(),
        }

    async def ask_answer(self, state: State, runtime: Runtime[Context]) -> Update:
        """After max_steps, or a draft that overflowed the context with room left: one
        continuation (capped by that room) that asks for the answer."""
        ctx = settings_of(runtime)
        room = state.get("answer_room")
        text, num_tokens, reply = await answer_fallback(
            self.backbone,
            state["question"],
            state.get("system_prompt"),
            kept_texts(state),
            max_tokens=min(ctx.max_step_tokens, room) if room else ctx.max_step_tokens,
            fmt=ctx.step_style,
        )
        return {
            "fallback": {"text": text, "num_tokens": num_tokens},
            "finish_reason": "context_length" if room else "max_steps",
            "usage": reply.usage("backbone").as_dict(),
        }


def draft_overflowed(state: State, overflow: ContextOverflow) -> Update:
    """The draft no longer fits the context: the solution ends, with a short answer request
    when the server said enough room is left for one."""
    room = overflow.room
    answer_room = room - FALLBACK_MARGIN_TOKENS if room is not None else None
    if answer_room is not None and answer_room < FALLBACK_MIN_TOKENS:
        answer_room = None
    return {
        "draft": None,
        "done": True,
        "finish_reason": "context_length",
        "answer_room": answer_room,
    }


def answer_overflowed(state: State, overflow: ContextOverflow) -> Update:
    """The answer request no longer fits the context: the solution ends without a fallback."""
    return {"fallback": None, "finish_reason": "context_length"}


async def score_uncertainty(state: State) -> Update:
    """m_t (mean -logprob) and the mean token probability of the draft."""
    draft = drafted(state)
    if draft["num_tokens"] == 0:
        # Nothing was generated: the solution is over, there is nothing to score.
        return {"done": True, "finish_reason": "empty_step"}
    record = GateRecord(
        uncertainty=step_uncertainty(draft["logprobs"]),
        confidence=step_confidence(draft["logprobs"]),
        threshold=None,
        scale=False,
    )
    if "first_token_entropy" in draft:
        record["first_token_entropy"] = draft["first_token_entropy"]
    return {"gate": record}


async def gamma_gate(state: State, runtime: Runtime[Context]) -> Update:
    """Decide whether this step deserves the expensive strategy."""
    ctx = settings_of(runtime)
    steps = state.get("steps", [])
    record = gated(state)
    if drafted(state)["finish_reason"] == ABORTED:  # the trace was stopped: nothing to refine
        return {"gate": {**record, "scale": False}}
    decision = decide(
        ctx.gate,
        step=len(steps) + 1,
        uncertainty=record["uncertainty"],
        confidence=record["confidence"],
        first_token_entropy=record.get("first_token_entropy"),
        history=GateHistory(
            momentum=state.get("momentum", 0.0),
            kept_uncertainties=[step["uncertainty"] for step in steps],
        ),
        params=ctx.gate_params(
            state["question"],
            budget_margin(
                steps,
                spent_tokens=sum(state.get("usage", {}).get(k, 0) for k in SPENT_KEYS),
                draft_tokens=drafted(state)["num_tokens"],
                settings=ctx.budget_settings(),
            )
            if ctx.budget_mode
            else None,
        ),
    )
    return {"gate": {**record, "threshold": decision.threshold, "scale": decision.scale}}


async def commit_step(state: State, runtime: Runtime[Context]) -> Update:
    """Keep the step (refined or not), update the momentum with its uncertainty."""
    ctx = settings_of(runtime)
    gate = gated(state)
    scaled = gate["scale"]
    kept = state.get("kept") if scaled else None
    if kept is None or kept["num_tokens"] == 0:
        kept = drafted(state)
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
        strategy=ctx.strategy if scaled else None,
        num_tokens=kept["num_tokens"],
        refine=state.get("refine") if scaled else None,
    )
    if "confidences" in kept:
        record["confidences"] = kept["confidences"]
    if "entropy_spikes" in kept:
        record["entropy_spikes"] = kept["entropy_spikes"]
    if "first_token_entropy" in gate:
        record["first_token_entropy"] = gate["first_token_entropy"]
    runtime.stream_writer(
        {
            "event": "step",
            "trace": state.get("trace", 0),
            "parent": state.get("parent"),
            "branch_step": state.get("branch_step"),
            **record,
            "draft_uncertainty": gate["uncertainty"],
            "threshold": gate["threshold"],
            "logprobs": kept["logprobs"],
        }
    )
    update: Update = {"steps": [record], "momentum": after}
    if kept["finish_reason"] == ABORTED:  # the confidence watch stopped it part-way
        update.update(done=True, finish_reason="stopped")
    elif contains_answer(kept["text"]):
        update.update(done=True, finish_reason="answer")
    elif kept["ended_by_model"]:
        update.update(done=True, finish_reason="end_of_sequence")
    elif kept["finish_reason"] == "length" and kept["num_tokens"] < ctx.max_step_tokens:
        # Cut before its cap: the server stopped at the end of the context (vLLM shortens
        # max_tokens to the room left), so the next request could not fit.
        update.update(done=True, finish_reason="context_length")
    elif stops_after(
        [*state.get("steps", []), record], ctx.trace_rules(), state.get("stop_threshold")
    ):
        update.update(done=True, finish_reason="stopped")
    return update


async def finalize(state: State, runtime: Runtime[Context]) -> Update:
    """The answer: the text after the last 'the answer is' (or the last boxed)."""
    fallback = state.get("fallback")
    texts = [*kept_texts(state), fallback["text"] if fallback else ""]
    return {
        "answer": extract_answer("\n".join(texts)),
        "fallback": fallback,
        "finish_reason": state.get("finish_reason"),
        "config": settings_of(runtime).as_dict(),
    }


async def route_draft(state: State) -> str:
    if not state.get("done"):
        return "score_uncertainty"
    return "ask_answer" if state.get("answer_room") else "finalize"


async def route_score(state: State) -> str:
    return "finalize" if state.get("done") else "gamma_gate"


async def route_gate(state: State, runtime: Runtime[Context]) -> str:
    """A scaled step goes to the run's strategy (its subgraph's node is named after it)."""
    return settings_of(runtime).strategy if gated(state)["scale"] else "commit_step"


async def route_commit(state: State, runtime: Runtime[Context]) -> str:
    if state.get("done"):
        return "finalize"
    if len(state["steps"]) >= settings_of(runtime).max_steps:
        return "ask_answer"
    return "draft_step"
