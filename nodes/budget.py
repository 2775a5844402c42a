"""Budget mode: adapt MUR's threshold per question so a token budget (or a target fraction of
scaled steps) holds, while the gate keeps its ordering (the most uncertain steps first).

MUR scales step t when its excess uncertainty x_t = m_t - M_{t-1} exceeds -ln(gamma). Budget
mode replaces the fixed -ln(gamma) by the (1 - r) quantile of the excesses seen so far in this
question, where r is the fraction of the remaining steps the budget can still pay to scale.
Pure functions of numbers, like the gates, so a trace replays offline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mur.nodes.uncertainty import corrected_momentum


@dataclass(frozen=True)
class BudgetSettings:
    """What budget mode reads from the run's settings (one of the first two is set)."""

    budget_tokens: int | None
    target_scale_rate: float | None
    expected_steps: int
    scale_cost_factor: float
    gamma: float
    alpha: float
    bias_correction: bool


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


def seen_uncertainty(step: Mapping[str, Any]) -> float:
    """The uncertainty the gate saw for a kept step: its draft's when it was refined."""
    refine = step.get("refine")
    return float(
        refine["draft"]["uncertainty"] if step["scaled"] and refine else step["uncertainty"]
    )


def drafted_tokens(step: Mapping[str, Any]) -> int:
    refine = step.get("refine")
    drafted = refine["draft"] if step["scaled"] and refine else step
    return int(drafted["num_tokens"])


def budget_margin(
    steps: Sequence[Mapping[str, Any]],
    *,
    spent_tokens: int,
    draft_tokens: int,
    settings: BudgetSettings,
) -> float:
    """Budget mode's excess threshold for the current draft (it replaces -ln(gamma)).

    `steps` are the kept step records so far, `spent_tokens` every token generated for this
    question (the current draft's `draft_tokens` included).
    """
    if settings.target_scale_rate is not None:
        rate = settings.target_scale_rate
    elif settings.budget_tokens is not None:
        spend = Spend(
            total_tokens=spent_tokens - draft_tokens,
            draft_tokens=sum(drafted_tokens(step) for step in steps),
            steps_done=len(steps),
            scaled_steps=sum(1 for step in steps if step["scaled"]),
        )
        rate = affordable_rate(
            spend,
            budget_tokens=settings.budget_tokens,
            expected_steps=settings.expected_steps,
            scale_cost_factor=settings.scale_cost_factor,
            next_draft_tokens=draft_tokens,
        )
    else:
        raise ValueError("budget mode needs budget_tokens or target_scale_rate")
    # Excess over the same reference the threshold is built on (bias-corrected or raw).
    references = [
        corrected_momentum(step["momentum_before"], i, settings.alpha)
        if settings.bias_correction
        else step["momentum_before"]
        for i, step in enumerate(steps)
    ]
    excesses = [seen_uncertainty(s) - ref for s, ref in zip(steps, references, strict=True)]
    return rate_threshold(excesses[1:], rate, fallback=-math.log(settings.gamma))
