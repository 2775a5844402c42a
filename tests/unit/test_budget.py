"""Budget mode: the rate the budget affords, the threshold that keeps the gate's ordering."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fakes import FakeLogprobChat, Scripted
from mur.graphs import Context, build_graph
from mur.nodes.budget import Spend, affordable_rate, rate_threshold

# Draft uncertainty per step: steps 3, 5 and 7 stand out.
STEP_M = {1: 0.5, 2: 0.55, 3: 2.0, 4: 0.6, 5: 1.8, 6: 0.5, 7: 2.2, 8: 0.5}


def test_rate_threshold() -> None:
    assert rate_threshold([1.0, 2.0], 0.0, fallback=0.1) == math.inf
    assert rate_threshold([], 0.5, fallback=0.1) == 0.1
    assert rate_threshold([1.0, 2.0, 3.0], 0.5, fallback=0.1) == 2.0
    assert rate_threshold([1.0, 2.0], 1.0, fallback=0.1) == -math.inf


@given(
    st.lists(st.floats(-5, 5), min_size=1, max_size=20),
    st.floats(0.01, 0.99),
    st.floats(0.01, 0.99),
)
def test_a_smaller_rate_never_lowers_the_threshold(excesses, r1, r2) -> None:
    low, high = sorted((r1, r2))
    assert rate_threshold(excesses, low, 0.0) >= rate_threshold(excesses, high, 0.0)


def test_affordable_rate() -> None:
    fresh = Spend(total_tokens=0, draft_tokens=0, steps_done=0, scaled_steps=0)
    # 8 steps of 10 tokens = 80; 320 more pays 8 scaled steps of 4 drafts each.
    assert (
        affordable_rate(
            fresh, budget_tokens=400, expected_steps=8, scale_cost_factor=4, next_draft_tokens=10
        )
        == 1.0
    )
    assert affordable_rate(
        fresh, budget_tokens=240, expected_steps=8, scale_cost_factor=4, next_draft_tokens=10
    ) == pytest.approx(0.5)
    spent = Spend(total_tokens=300, draft_tokens=60, steps_done=6, scaled_steps=2)
    # 2 steps left cost 20; 100 left pays 100 / 120 per scaled step of the 2 steps.
    assert affordable_rate(
        spent, budget_tokens=420, expected_steps=8, scale_cost_factor=4, next_draft_tokens=10
    ) == pytest.approx(100 / 120 / 2)
    assert (
        affordable_rate(
            spent, budget_tokens=300, expected_steps=8, scale_cost_factor=4, next_draft_tokens=10
        )
        == 0.0
    )


def respond(messages, kwargs):
    if "You are a teacher" in str(messages[0].content):
        return Scripted("\\boxed{No}", [-0.1] * 10, stop_reason=None)
    index = int(re.findall(r"Step(\d+):$", str(messages[-1].content))[-1])
    if isinstance(messages[-2].content, str) and "incorrect" in messages[-2].content:
        ending = ": the answer is 1." if index == 8 else ""
        return Scripted(f" revised {index}{ending}", [-0.5] * 10)
    if index == 8:
        return Scripted(" so the answer is 1.", [-STEP_M[8]] * 10, stop_reason=None)
    return Scripted(f" step {index}", [-STEP_M[index]] * 10)


async def solve(**settings) -> dict:
    graph = build_graph(backbone=FakeLogprobChat(responder=respond))
    return await graph.ainvoke({"question": "q"}, context=Context(gate="mur", **settings))


async def test_target_rate_scales_the_standout_steps() -> None:
    result = await solve(target_scale_rate=0.3)
    scaled = [s["index"] for s in result["steps"] if s["scaled"]]
    # Step 2 has no earlier excess to rank against: plain MUR decides it (and scales it, as
    # the uncorrected momentum is still low); from then on the standouts are scaled.
    assert scaled == [2, 3, 5, 7]


async def test_a_tight_budget_stops_scaling_and_holds() -> None:
    unlimited = await solve(target_scale_rate=1.0)
    generous = await solve(budget_tokens=10_000)
    tight = await solve(budget_tokens=120)
    drafts_only = await solve(budget_tokens=80)
    spent = lambda r: r["usage"]["backbone_tokens"] + r["usage"]["external_tokens"]  # noqa: E731
    assert sum(s["scaled"] for s in drafts_only["steps"]) == 0
    assert spent(drafts_only) == 80  # eight drafts of ten tokens, nothing left to scale
    assert (
        0 < sum(s["scaled"] for s in tight["steps"]) < sum(s["scaled"] for s in generous["steps"])
    )
    assert spent(tight) <= 120
    assert spent(tight) < spent(generous) <= spent(unlimited)


def test_budget_mode_needs_the_mur_gate() -> None:
    with pytest.raises(ValueError, match="gate mur"):
        Context(gate="always", budget_tokens=100)
    with pytest.raises(ValueError, match="not both"):
        Context(budget_tokens=100, target_scale_rate=0.2)
    with pytest.raises(ValueError, match="target_scale_rate must be less than or equal to 1"):
        Context(target_scale_rate=1.5)
