"""Detectors that decide which steps get the expensive refine strategy.

Every baseline of the paper is a gate here, so all of them run in the same graph. The graph
and `replay_decisions` call the same `decide` function: a trace recorded by the graph replays
offline to the same decisions.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from nodes.uncertainty import check_alpha, corrected_momentum, update_momentum

GateName = Literal["mur", "always", "never", "average", "smart", "random"]
GATES: tuple[str, ...] = get_args(GateName)
#: The gates whose decisions read gamma; a gamma sweep runs the others once.
GAMMA_GATES: frozenset[str] = frozenset({"mur"})


@dataclass(frozen=True)
class GateParams:
    """Numbers the gates read; validated once so a bad value fails before any model call."""

    alpha: float = 0.9
    gamma: float = 0.9
    bias_correction: bool = False
    tau: float = 0.9
    rate: float = 0.5
    seed: int = 0
    margin: float | None = None  # budget mode: the excess needed, replacing -ln(gamma)

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        if not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise ValueError(f"gamma must be a finite number > 0, got {self.gamma}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must lie in [0, 1], got {self.rate}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must lie in (0, 1], got {self.tau}")


@dataclass(frozen=True)
class GateDecision:
    """Whether to scale step t, and the threshold its score was compared against (if any)."""

    scale: bool
    threshold: float | None = None


@dataclass
class GateHistory:
    """What the gates remember of the kept steps: momentum and their uncertainties."""

    momentum: float = 0.0
    kept_uncertainties: list[float] = field(default_factory=list)

    def commit(self, kept_uncertainty: float, alpha: float) -> None:
        self.momentum = update_momentum(self.momentum, kept_uncertainty, alpha)
        self.kept_uncertainties.append(kept_uncertainty)


def check_gate(gate: str) -> None:
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}: choose one of {', '.join(GATES)}")


def mur_threshold(momentum: float, steps_seen: int, params: GateParams) -> float:
    """The uncertainty above which MUR scales: M_{t-1} - ln(gamma), optionally bias-corrected.

    exp(m_t) > exp(M_{t-1}) / gamma  <=>  m_t > M_{t-1} - ln(gamma).
    """
    reference = (
        corrected_momentum(momentum, steps_seen, params.alpha)
        if params.bias_correction
        else momentum
    )
    margin = -math.log(params.gamma) if params.margin is None else params.margin
    return reference + margin


def derive_seed(seed: int, step: int) -> int:
    """A per-step seed, so each step's draw is fixed by (run seed, step) and replays."""
    return seed * 1_000_003 + step


def question_seed(seed: int, question: str) -> int:
    """One question's seed: the run's seed mixed with the question text (sha256, stable across
    processes). With the run seed alone every question of a benchmark drew the same numbers,
    so the random gate scaled the same step numbers everywhere: at rate 0.218 only steps 14
    and 18, 3% of steps instead of 22%."""
    digest = hashlib.sha256(f"{seed}\n{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def random_draw(seed: int, step: int) -> float:
    """A uniform number fixed by (seed, step), so the random gate replays exactly."""
    return random.Random(derive_seed(seed, step)).random()


def decide(
    gate: str,
    *,
    step: int,
    uncertainty: float,
    confidence: float | None,
    history: GateHistory,
    params: GateParams,
) -> GateDecision:
    """The scale decision for 1-based step `step` whose draft has this uncertainty."""
    check_gate(gate)
    if step < 1:
        raise ValueError(f"steps are numbered from 1, got {step}")
    if gate == "never":
        return GateDecision(False)
    if gate == "always":
        return GateDecision(True)
    if gate == "smart":
        if confidence is None:
            raise ValueError("the smart gate needs the step's token confidence")
        return GateDecision(confidence < params.tau, params.tau)
    if step < 2:
        # No momentum yet: the first step is never scaled by the history-based gates.
        return GateDecision(False)
    if gate == "mur":
        threshold = mur_threshold(history.momentum, len(history.kept_uncertainties), params)
        return GateDecision(uncertainty > threshold, threshold)
    if gate == "average":
        threshold = math.fsum(history.kept_uncertainties) / len(history.kept_uncertainties)
        return GateDecision(uncertainty > threshold, threshold)
    # random: scale with probability `rate`, to match another gate's scaled fraction.
    return GateDecision(random_draw(params.seed, step) < params.rate, params.rate)


def replay_decisions(
    gate: str,
    uncertainties: Sequence[float],
    *,
    alpha: float = 0.9,
    gamma: float = 0.9,
    bias_correction: bool = False,
    tau: float = 0.9,
    confidences: Sequence[float] | None = None,
    rate: float = 0.5,
    seed: int = 0,
    draft_uncertainties: Sequence[float | None] | None = None,
) -> list[bool]:
    """The decision for each step of a sequence of kept-step uncertainties (step 1 first).

    The momentum follows the kept uncertainties. A scaled step's kept text is the refined one,
    whose uncertainty differs from the draft the gate saw: pass the draft uncertainties (None
    where the draft was kept) to replay a recorded trace exactly.
    """
    check_gate(gate)
    params = GateParams(
        alpha=alpha, gamma=gamma, bias_correction=bias_correction, tau=tau, rate=rate, seed=seed
    )
    if gate == "smart" and (confidences is None or len(confidences) != len(uncertainties)):
        raise ValueError("the smart gate replays from confidences, one per step")
    if draft_uncertainties is not None and len(draft_uncertainties) != len(uncertainties):
        raise ValueError("draft_uncertainties must have one entry per step")
    history = GateHistory()
    decisions: list[bool] = []
    for index, kept in enumerate(uncertainties):
        seen = kept
        if draft_uncertainties is not None and draft_uncertainties[index] is not None:
            seen = draft_uncertainties[index]
        decision = decide(
            gate,
            step=index + 1,
            uncertainty=seen,
            confidence=confidences[index] if confidences is not None else None,
            history=history,
            params=params,
        )
        decisions.append(decision.scale)
        history.commit(kept, alpha)
    return decisions
