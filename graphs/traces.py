"""A question solved by several traces: each trace is the MUR loop (graphs/mur.py builds it as
a subgraph), started in batches from `plan_traces`, and `vote` reduces them to one answer:

    plan_traces --Send x batch--> trace (the loop) --> plan_traces --(settled or all drawn)--> vote

plan_traces decides with the pure rules of nodes.settling and nodes.trace_stop: how many traces
to start next (the settle rule), and after the warm-up batch the threshold at which a later
trace stops (the stop rule, which commit_step checks after every step). One trace (the
default) is the plain MUR loop: the vote over one trace is that trace.

With a branch rule (nodes.branching) a trace after the warm-up is a branch: it starts with
its parent's steps before the branch point (and their momentum), so it draws only the rest;
its tokens are those it draws, its summary names its parent and branch step.

A trace's summary (answer, tokens, momentum, DeepConf's confidences) is made by
`summarize_trace` from its output, live and when replaying recorded traces alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from langgraph.runtime import Runtime
from langgraph.types import Send

from mur.graphs.loop import settings_of, trace_confidences
from mur.graphs.records import StepRecord, TraceSummary
from mur.graphs.state import Context, QuestionState, TraceInput, TraceOutput
from mur.nodes.branching import ParentStep, Spike, branch_points, plan_branch
from mur.nodes.confidence import TraceConfidence, trace_confidence
from mur.nodes.settling import next_batch
from mur.nodes.trace_stop import stop_threshold
from mur.nodes.voting import TraceOutcome, answer_key, tally, vote_weight

Update = dict[str, Any]

# ---------------------------------------------------------------------------- summaries


def summarize_trace(
    index: int, output: dict[str, Any], ctx: Context, start: TraceInput | None = None
) -> TraceSummary:
    """A trace's summary from its output contract (a live trace's, or a recorded run's) and,
    for a branch, what it started from."""
    steps: list[StepRecord] = output.get("steps") or []
    usage = output.get("usage") or {}
    confidences = trace_confidences(steps)
    measures = (
        trace_confidence(confidences, window=ctx.group_window, tail=ctx.tail_tokens).as_dict()
        if confidences
        else None
    )
    summary = TraceSummary(
        index=index,
        answer=output.get("answer"),
        finish_reason=output.get("finish_reason"),
        stopped=output.get("finish_reason") == "stopped",
        steps=len(steps),
        tokens=usage.get("backbone_tokens", 0) + usage.get("external_tokens", 0),
        momentum=steps[-1]["momentum_after"] if steps else 0.0,
        confidence=measures,
        weight=0.0,
        parent=start.get("parent") if start else None,
        branch_step=start.get("branch_step") if start else None,
        branch_token=start.get("branch_token") if start else None,
    )
    if ctx.branch != "none":
        params = ctx.branch_params(output.get("question", ""))
        summary["branch_points"] = len(
            branch_points(index, parent_steps(steps), ctx.branch, params)
        )
    return summary


def parent_steps(steps: Sequence[StepRecord]) -> list[ParentStep]:
    """What the branch rules read of a trace's kept steps."""
    return [
        ParentStep(
            uncertainty=step["uncertainty"],
            momentum_before=step["momentum_before"],
            spikes=tuple(Spike(**spike) for spike in step.get("entropy_spikes", ())),
        )
        for step in steps
    ]


def trace_input(
    state: QuestionState, index: int, threshold: float | None, ctx: Context
) -> TraceInput:
    """What trace `index` starts from: the question afresh, or, after the warm-up under a
    branch rule, a branch of a warm-up trace at the point the rule picks."""
    start = TraceInput(
        question=state["question"],
        system_prompt=state.get("system_prompt"),
        trace=index,
        stop_threshold=threshold,
    )
    first = ctx.trace_rules().first_batch
    if ctx.branch == "none" or index < first:
        return start
    outputs = _by_index(state)
    warmups = [outputs[i]["steps"] for i in range(first)]
    point = plan_branch(
        index - first,
        [parent_steps(steps) for steps in warmups],
        ctx.branch,
        ctx.branch_params(state["question"]),
    )
    if point is None:
        return start
    kept = warmups[point.parent][: point.step - 1]
    partial = (
        warmups[point.parent][point.step - 1]["text"][: point.chars]
        if point.token is not None
        else None
    )
    return TraceInput(
        **start,
        parent=point.parent,
        branch_step=point.step,
        branch_token=point.token,
        steps=list(kept),
        momentum=kept[-1]["momentum_after"] if kept else 0.0,
        partial=partial,
    )


def _by_index(state: QuestionState) -> dict[int, TraceOutput]:
    """The finished traces' outputs by trace index (they arrive in finishing order)."""
    return {
        summary["index"]: output
        for summary, output in zip(state.get("drawn", []), state.get("outputs", []), strict=True)
    }


def outcome_of(summary: TraceSummary) -> TraceOutcome:
    """What the pure rules read of a summary."""
    measures = summary["confidence"] or {}
    return TraceOutcome(
        index=summary["index"],
        answer=summary["answer"],
        momentum=summary["momentum"],
        confidence=TraceConfidence(
            lowest_group=measures.get("lowest_group"),
            bottom_10=measures.get("bottom_10"),
            tail=measures.get("tail"),
            mean=measures.get("mean"),
        ),
        tokens=summary["tokens"],
        stopped=summary["stopped"],
    )


# ---------------------------------------------------------------------------- nodes


async def plan_traces(state: QuestionState, runtime: Runtime[Context]) -> Update:
    """After the warm-up batch, fix the threshold at which later traces stop."""
    rules = settings_of(runtime).trace_rules()
    drawn = state.get("drawn", [])
    if len(drawn) != rules.first_batch or state.get("stop_threshold") is not None:
        return {}
    return {"stop_threshold": stop_threshold([outcome_of(s) for s in drawn], rules)}


async def route_traces(state: QuestionState, runtime: Runtime[Context]) -> list[Send] | str:
    """Start the next batch of traces, or vote when the question is settled."""
    ctx = settings_of(runtime)
    drawn = state.get("drawn", [])
    count = next_batch([outcome_of(s) for s in drawn], ctx.trace_rules())
    if count == 0:
        return "vote"
    threshold = state.get("stop_threshold") if drawn else None
    return [
        Send("trace", trace_input(state, index, threshold, ctx))
        for index in range(len(drawn), len(drawn) + count)
    ]


class TraceNode(Protocol):
    """A node over one trace's input (a Send's) with the run's Context, as LangGraph calls it."""

    async def __call__(self, state: TraceInput, *, runtime: Runtime[Context]) -> Update: ...


def trace_node(loop: Any) -> TraceNode:
    """The node that runs one trace: the compiled loop `loop` on the Send's input. LangGraph
    finds `loop` in this closure, so it draws it as a subgraph and checkpoints it under the
    trace's own namespace (the run's config reaches it through the call's context)."""

    async def trace(state: TraceInput, *, runtime: Runtime[Context]) -> Update:
        output = await loop.ainvoke(state, context=runtime.context)
        summary = summarize_trace(state.get("trace", 0), output, settings_of(runtime), state)
        return {"drawn": [summary], "outputs": [output], "usage": output["usage"]}

    return trace


async def vote(state: QuestionState, runtime: Runtime[Context]) -> Update:
    """The voted answer; the steps shown are those of the heaviest trace that gave it."""
    ctx = settings_of(runtime)
    rules = ctx.trace_rules()
    drawn = sorted(state.get("drawn", []), key=lambda s: s["index"])
    outputs = _by_index(state)
    outcomes = [outcome_of(s) for s in drawn]
    result = tally(outcomes, rules)
    weights = {
        o.index: vote_weight(o, rules) if o.index in result.voters else 0.0 for o in outcomes
    }
    summaries = [TraceSummary(**{**s, "weight": weights[s["index"]]}) for s in drawn]
    shown = _shown_trace(summaries, result.answer)
    output = outputs[shown]
    return {
        "answer": result.answer if len(drawn) > 1 else output.get("answer"),
        "finish_reason": output.get("finish_reason"),
        "steps": output.get("steps", []),
        "fallback": output.get("fallback"),
        "config": ctx.as_dict(),
        "traces": summaries,
    }


def _shown_trace(summaries: Sequence[TraceSummary], answer: str | None) -> int:
    """The trace whose steps stand for the question: the heaviest voter for the winning
    answer (the first on a tie), else the first trace."""
    key = answer_key(answer)
    winners = [s for s in summaries if s["weight"] > 0 and answer_key(s["answer"]) == key]
    if not winners:
        return summaries[0]["index"]
    return max(winners, key=lambda s: (s["weight"], -s["index"]))["index"]


# ---------------------------------------------------------------------------- what a person sees


def trace_label(trace: int, parent: int | None = None, branch_step: int | None = None) -> str:
    """A trace as a person reads it: `trace 3`, or `trace 3 (branch of 0 at step 2)`."""
    if parent is None:
        return f"trace {trace}"
    return f"trace {trace} (branch of {parent} at step {branch_step})"


def traces_line(summaries: Sequence[TraceSummary]) -> str | None:
    """One line on a question's traces: how many were drawn, branched and stopped, and the
    vote's tally, heaviest answer first (None for a single trace: it is the answer)."""
    if len(summaries) <= 1:
        return None
    branched = sum(1 for s in summaries if s.get("parent") is not None)
    stopped = sum(1 for s in summaries if s["stopped"])
    ballots: dict[str, tuple[str, int, float]] = {}
    for summary in sorted(summaries, key=lambda s: s["index"]):
        if summary["weight"] > 0:
            key = answer_key(summary["answer"])
            shown, count, weight = ballots.get(key, (summary["answer"] or "", 0, 0.0))
            ballots[key] = (shown, count + 1, weight + summary["weight"])
    weighted = any(weight != count for _, count, weight in ballots.values())
    tally = ", ".join(
        f"{shown} x{count}" + (f" ({weight:.2f})" if weighted else "")
        for shown, count, weight in sorted(ballots.values(), key=lambda b: -b[2])
    )
    silent = len(summaries) - stopped - sum(count for _, count, _ in ballots.values())
    line = f"{len(summaries)} traces ({branched} branched, {stopped} stopped); vote: "
    line += tally or "no answer"
    return line + (f"; {silent} without a vote" if silent else "")
