"""Budget mode: adapt MUR's threshold per question so a token budget (or a target fraction of
scaled steps) holds, while the gate keeps its ordering (the most uncertain steps first).

MUR scales step t when its excess uncertainty x_t = m_t - M_{t-1} exceeds -ln(gamma). Budget
mode replaces the fixed -ln(gamma) by the (1 - r) quantile of the excesses seen so far in this
question, where r is the fraction of the remaining steps the budget can still pay to scale.
Pure functions of numbers, like the gates, so a trace replays offline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Spend:
    """What a question has cost so far, split into plain drafting and scaling."""

    total_tokens: int  # every generated token, backbone + external
    draft_tokens: int  # tokens of the drafts of the kept steps
    steps_done: int
    scaled_steps: int


def affordable_rate(
    spend: Spend,
    *,
    budget_tokens: int,
    expected_steps: int,
    scale_cost_factor: float,
    next_draft_tokens: int,
) -> float:
    """The fraction of the remaining steps the budget can still scale, in [0, 1].

    A step costs its draft (the mean draft so far, or the current one at the start); a scaled
    step costs in addition what scaled steps cost so far on average, or `scale_cost_factor`
    drafts before any step was scaled. The steps left are `expected_steps` minus those done,
    at least one (this one).
    """
    steps_left = max(expected_steps - spend.steps_done, 1)
    draft_cost = (
        spend.draft_tokens / spend.steps_done if spend.steps_done else float(next_draft_tokens)
    )
    scale_cost = (
        (spend.total_tokens - spend.draft_tokens) / spend.scaled_steps
        if spend.scaled_steps
        else scale_cost_factor * draft_cost
    )
    remaining = budget_tokens - spend.total_tokens - steps_left * draft_cost
    if remaining <= 0 or scale_cost <= 0:
        return 0.0
    return min(remaining / scale_cost / steps_left, 1.0)


def rate_threshold(earlier_excesses: Sequence[float], rate: float, fallback: float) -> float:
    """The excess above which a step is among the top `rate` of this question's steps.

    With no earlier excess to rank against, the plain MUR threshold (`fallback`) applies.
    """
    if rate <= 0:
        return math.inf
    if not earlier_excesses:
        return fallback
    if rate >= 1:
        return -math.inf
    return float(np.quantile(np.asarray(earlier_excesses, dtype=float), 1.0 - rate))
