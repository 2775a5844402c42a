"""Branching traces: the pure branch-point rules, and a branch in the graph against a scripted
fake (it keeps its parent's steps before the branch point, draws only the rest, counts only
what it drew, and its summary names its parent and branch step)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from langchain_core.messages import BaseMessage
from test_traces import QUESTION, context, graph_for

from fakes import FakeLogprobChat, Scripted
from mur.graphs.mur import build_graph
from mur.graphs.solve import solve
from mur.graphs.state import Context, ContextError
from mur.nodes.branching import (
    BRANCH_RULES,
    BranchParams,
    BranchPoint,
    ParentStep,
    Spike,
    mur_excess,
    plan_branch,
)
from mur.nodes.confidence import token_entropy
from mur.nodes.gates import GateParams
from mur.nodes.uncertainty import update_momentum

PARAMS = BranchParams(gate=GateParams(seed=7))


def steps_of(
    uncertainties: list[float], spikes: dict[int, list[Spike]] | None = None
) -> list[ParentStep]:
    """A parent's steps with these uncertainties (momentum as the loop keeps it)."""
    momentum, steps = 0.0, []
    for t, m in enumerate(uncertainties, start=1):
        steps.append(ParentStep(m, momentum, tuple((spikes or {}).get(t, ()))))
        momentum = update_momentum(momentum, m, 0.9)
    return steps


def test_mur_max_orders_steps_by_their_excess_over_the_gate() -> None:
    parent = steps_of([0.2, 0.9, 0.3, 0.1])
    excess = dict(mur_excess(parent, PARAMS.gate))
    assert list(excess) == [2, 3, 4]  # step 1 has no momentum to compare with
    assert excess[2] == pytest.approx(0.9 - (0.02 - math.log(0.9)))
    order = [plan_branch(n * 2, [parent, parent], "mur_max", PARAMS) for n in range(4)]
    assert [p.step for p in order if p] == [2, 3, 4, 2]  # cycling past the last point
    assert all(p is not None and p.parent == 0 and p.token is None for p in order)


def test_mur_first_takes_flagged_steps_in_order_then_by_excess() -> None:
    parent = steps_of([0.1, 0.5, 0.1, 0.9, 0.1])  # flagged: steps 2 and 4
    flagged = [t for t, e in mur_excess(parent, PARAMS.gate) if e > 0]
    assert flagged == [2, 4]
    firsts = [plan_branch(n, [parent], "mur_first", PARAMS) for n in range(4)]
    assert [p.step for p in firsts if p] == [2, 4, 3, 5]
    maxes = [plan_branch(n, [parent], "mur_max", PARAMS) for n in range(2)]
    assert [p.step for p in maxes if p] == [4, 2]


def test_random_draws_every_step_from_two_once_and_replays() -> None:
    parent = steps_of([0.3] * 6)
    drawn = [plan_branch(n, [parent], "random", PARAMS) for n in range(5)]
    steps = [p.step for p in drawn if p]
    assert sorted(steps) == [2, 3, 4, 5, 6]
    assert steps == [p.step for n in range(5) if (p := plan_branch(n, [parent], "random", PARAMS))]
    other = BranchParams(gate=GateParams(seed=8))
    orders = {
        tuple(p.step for n in range(5) if (p := plan_branch(n, [parent], "random", params)))
        for params in (PARAMS, other)
    }
    assert len(orders) == 2  # another question's seed draws another order


def test_eager_branches_at_entropy_spikes_in_order_of_position() -> None:
    spikes = {1: [Spike(3, 11, 2.5)], 3: [Spike(0, 0, 2.1), Spike(5, 20, 3.0)]}
    parent = steps_of([0.3, 0.3, 0.3], spikes)
    points = [plan_branch(n, [parent], "eager", PARAMS) for n in range(3)]
    assert points == [
        BranchPoint(0, 1, 3, 11),
        BranchPoint(0, 3, 0, 0),
        BranchPoint(0, 3, 5, 20),
    ]


def test_no_point_means_a_fresh_trace() -> None:
    one_step = steps_of([0.4])
    for rule in BRANCH_RULES:
        assert plan_branch(0, [one_step], rule, PARAMS) is None
    assert plan_branch(0, [], "mur_max", PARAMS) is None
    with pytest.raises(ValueError, match="unknown branch rule 'deepest'"):
        plan_branch(0, [one_step], "deepest", PARAMS)


def test_top_k_entropy() -> None:
    assert token_entropy([-0.0]) == 0.0
    assert token_entropy([math.log(0.5)] * 2) == pytest.approx(math.log(2), abs=1e-3)
    # renormalized over the k given: three equal logprobs are ln 3, whatever their level
    assert token_entropy([-5.0, -5.0, -5.0]) == pytest.approx(math.log(3), abs=1e-3)


def test_branching_needs_batches_and_eager_needs_logprobs() -> None:
    with pytest.raises(ContextError, match="set trace_batch below traces"):
        Context(traces=4, branch="mur_max")
    with pytest.raises(ContextError, match="branch eager reads token entropies"):
        Context(traces=4, trace_batch=2, branch="eager")
    assert Context(traces=4, trace_batch=2, branch="eager", top_logprobs=20).branch == "eager"


# ------------------------------------------------------------------------------ in the graph

PLANS = [([0.2, 0.9, 0.3], "42"), ([0.2, 0.2, 0.8, 0.1], "42")]


async def test_a_branch_keeps_the_prefix_and_counts_only_what_it_draws() -> None:
    graph, script = graph_for(PLANS)
    settings = context(traces=4, trace_batch=2, branch="mur_max")
    output = await graph.ainvoke({"question": QUESTION}, context=settings)
    traces = {s["index"]: s for s in output["traces"]}
    # mur_max: trace 0's step 2 (excess 0.775), trace 1's step 3 (excess 0.657)
    assert (traces[2]["parent"], traces[2]["branch_step"]) == (0, 2)
    assert (traces[3]["parent"], traces[3]["branch_step"]) == (1, 3)
    assert traces[0]["parent"] is None and traces[0]["branch_step"] is None
    assert traces[2]["steps"] == 3 and traces[2]["tokens"] == 2 * 4
    assert traces[3]["steps"] == 4 and traces[3]["tokens"] == 2 * 4
    assert output["usage"]["backbone_tokens"] == script.generated == (3 + 4 + 2 + 2) * 4
    assert output["usage"]["llm_calls"] == 3 + 4 + 2 + 2


async def test_a_branch_starts_from_its_parents_steps_and_momentum() -> None:
    graph, _ = graph_for(PLANS)
    settings = context(traces=3, trace_batch=2, branch="mur_max")
    solution = await solve(graph, QUESTION, context=settings)
    events: dict[int, list[dict[str, Any]]] = {}
    for event in solution.steps:
        events.setdefault(event["trace"], []).append(event)
    parent, branch = events[0], events[2]
    # the branch drew steps 2 and 3 only, from the momentum after its parent's step 1
    assert [e["index"] for e in branch] == [2, 3]
    assert branch[0]["momentum_before"] == parent[0]["momentum_after"]
    assert all((e["parent"], e["branch_step"]) == (0, 2) for e in branch)
    assert all(e["parent"] is None for e in parent)
    assert solution.output["answer"] == "42"


class Spiky:
    """Two warm-up traces that answer 42 in two steps; the second step's third token is a
    spike (three equal top logprobs: entropy ln 3). A request that continues inside step 2
    (its prefix does not end a step) gets the rest of that step with another answer."""

    STEP2 = "So the answer is 42."  # four tokens: "So th", "e ans", "wer i", "s 42."

    def __init__(self) -> None:
        self.started = itertools.count()
        self.generated = 0

    def __call__(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        prefix = str(messages[-1].content)
        if not prefix:
            text, stop, tops = f"First <tag {next(self.started)}>", "\n\n", None
        elif prefix.endswith("\n\n"):
            text, stop = self.STEP2, None
            tops = (
                [[("a", -0.2), ("b", -1.2)]] * 2
                + [[("a", -1.1)] * 3]
                + [[("a", -0.2), ("b", -1.2)]]
            )
        else:
            text, stop, tops = "wer is 43.", None, None
        tops = tops or [[("a", -0.2), ("b", -1.2)]] * 4
        self.generated += 4
        return Scripted(text, [-0.2] * 4, stop_reason=stop, top_logprobs=tops)


async def test_eager_branches_inside_the_step_at_the_first_spike() -> None:
    script = Spiky()
    model = FakeLogprobChat(responder=script)
    graph = build_graph(backbone=model)
    settings = context(traces=3, trace_batch=2, branch="eager", top_logprobs=3, branch_entropy=1.0)
    output = await graph.ainvoke({"question": QUESTION}, context=settings)
    traces = {s["index"]: s for s in output["traces"]}
    assert (traces[2]["parent"], traces[2]["branch_step"], traces[2]["branch_token"]) == (0, 2, 2)
    assert traces[2]["answer"] == "43" and traces[2]["tokens"] == 4
    # each warm-up offered one point (its spike); the branch redrew step 2 without one
    assert [traces[i]["branch_points"] for i in range(3)] == [1, 1, 0]
    # the branch asked to continue its parent's first step and the start of its second
    branch_prefix = str(model.calls[-1]["messages"][-1].content)
    assert branch_prefix.endswith("First <tag 0>\n\nSo the ans")
    assert output["answer"] == "42"
    assert output["usage"]["backbone_tokens"] == script.generated == 5 * 4
