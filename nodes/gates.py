"""Detectors that decide which steps get the expensive refine strategy.

Every baseline of the paper is a gate here, so all of them run in the same graph. The graph
and `replay_decisions` call the same `decide` function: a trace recorded by the graph replays
offline to the same decisions.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mur.nodes.registry import Registry
from mur.nodes.uncertainty import check_alpha, corrected_momentum, update_momentum


@dataclass(frozen=True)
class GateParams:
    """Numbers the gates read; validated once so a bad value fails before any model call."""

    alpha: float = 0.9
    gamma: float = 0.9
    bias_correction: bool = False
    tau: float = 0.9
    random_rate: float = 0.5
    first_token_threshold: float = 1.0
    seed: int = 0
    margin: float | None = None  # budget mode: the excess needed, replacing -ln(gamma)

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        if not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise ValueError(f"gamma must be a finite number > 0, got {self.gamma}")
        if not 0.0 <= self.random_rate <= 1.0:
            raise ValueError(f"random_rate must lie in [0, 1], got {self.random_rate}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must lie in (0, 1], got {self.tau}")
        if not (self.first_token_threshold >= 0 and math.isfinite(self.first_token_threshold)):
            raise ValueError(
                f"first_token_threshold must be a finite number >= 0, got "
                f"{self.first_token_threshold}"
            )


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


@dataclass(frozen=True)
class GateCall:
    """What a gate sees of step t: its number (from 1), its draft's uncertainty, token
    confidence and first token's entropy, the kept steps' history and the numbers the gates
    read."""

    step: int
    uncertainty: float
    confidence: float | None
    history: GateHistory
    params: GateParams
    first_token_entropy: float | None = None
    """The top-k entropy of the draft's first token (None: the run asked no top logprobs)."""


@dataclass(frozen=True)
class Gate:
    """One detector: its rule, and the facts the rest of the project reads from here (the
    CLI's choices, the runner's gamma sweep, table1's rows, the endpoint's model names)."""

    name: str
    rule: Callable[[GateCall], GateDecision]
    description: str
    from_step: int = 2
    """The first step it may scale: 2 for the gates that compare with the kept steps' history
    (step 1 has none, and is never scaled by them), 1 for the others."""
    reads_gamma: bool = False
    """Its decision depends on gamma, so a gamma sweep runs it once per gamma."""
    labels: tuple[str, ...] = ()
    """The labels a run names it by in its standard settings (`nodes.gate_labels`: `mur+bc` is
    mur with bias correction); an evaluation of every gate runs them all."""
    reads_first_token: bool = False
    """It reads the draft's first token's entropy, so the run must ask for top logprobs."""


def _mur(call: GateCall) -> GateDecision:
    history, params = call.history, call.params
    threshold = mur_threshold(history.momentum, len(history.kept_uncertainties), params)
    return GateDecision(call.uncertainty > threshold, threshold)


def _average(call: GateCall) -> GateDecision:
    kept = call.history.kept_uncertainties
    threshold = math.fsum(kept) / len(kept)
    return GateDecision(call.uncertainty > threshold, threshold)


def _smart(call: GateCall) -> GateDecision:
    if call.confidence is None:
        raise ValueError("the smart gate needs the step's token confidence")
    return GateDecision(call.confidence < call.params.tau, call.params.tau)


def _first_token(call: GateCall) -> GateDecision:
    if call.first_token_entropy is None:
        raise ValueError("the first_token gate needs the draft's top logprobs: set top_logprobs")
    threshold = call.params.first_token_threshold
    return GateDecision(call.first_token_entropy > threshold, threshold)


def _random(call: GateCall) -> GateDecision:
    rate = call.params.random_rate
    return GateDecision(random_draw(call.params.seed, call.step) < rate, rate)


GATES = Registry(  # the paper's order: its Table 1 rows follow it
    "gate",
    Gate(
        "never",
        lambda call: GateDecision(False),
        "Vanilla CoT: no step",
        from_step=1,
        labels=("never",),
    ),
    Gate(
        "always",
        lambda call: GateDecision(True),
        "Per-Step Scale: every step",
        from_step=1,
        labels=("always",),
    ),
    Gate(
        "mur",
        _mur,
        "MUR's gamma-gate: m_t > M_{t-1} - ln(gamma)",
        reads_gamma=True,
        labels=("mur", "mur+bc"),
    ),
    Gate(
        "average",
        _average,
        "Avg uncertainty: m_t above the mean of the kept steps'",
        labels=("average",),
    ),
    Gate(
        "smart",
        _smart,
        "SMART: mean token probability below tau",
        from_step=1,
        labels=("smart",),
    ),
    Gate(
        "first_token",
        _first_token,
        "GlimpRouter: the draft's first token's top-k entropy above first_token_threshold",
        from_step=1,
        reads_first_token=True,
    ),
    Gate("random", _random, "random at a rate, to match another gate's scaled share"),
)
#: The gates whose decisions read gamma; a gamma sweep runs the others once.
GAMMA_GATES: frozenset[str] = frozenset(g.name for g in GATES.values() if g.reads_gamma)


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
    processes), so that each question of a benchmark draws its own numbers; with the run seed
    alone every question would scale the same step numbers."""
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
    first_token_entropy: float | None = None,
) -> GateDecision:
    """The scale decision for 1-based step `step` whose draft has this uncertainty."""
    chosen = GATES[gate]
    if step < 1:
        raise ValueError(f"steps are numbered from 1, got {step}")
    if step < chosen.from_step:
        return GateDecision(False)  # no momentum yet: nothing to compare with
    call = GateCall(step, uncertainty, confidence, history, params, first_token_entropy)
    return chosen.rule(call)


def replay_decisions(
    gate: str,
    uncertainties: Sequence[float],
    *,
    alpha: float = 0.9,
    gamma: float = 0.9,
    bias_correction: bool = False,
    tau: float = 0.9,
    confidences: Sequence[float] | None = None,
    random_rate: float = 0.5,
    seed: int = 0,
    draft_uncertainties: Sequence[float | None] | None = None,
    first_token_entropies: Sequence[float] | None = None,
    first_token_threshold: float = 1.0,
) -> list[bool]:
    """The decision for each step of a sequence of kept-step uncertainties (step 1 first).

    The momentum follows the kept uncertainties. A scaled step's kept text is the refined one,
    whose uncertainty differs from the draft the gate saw: pass the draft uncertainties (None
    where the draft was kept) to replay a recorded trace exactly.
    """
    GATES.check(gate)
    params = GateParams(
        alpha=alpha,
        gamma=gamma,
        bias_correction=bias_correction,
        tau=tau,
        random_rate=random_rate,
        first_token_threshold=first_token_threshold,
        seed=seed,
    )
    if gate == "smart" and (confidences is None or len(confidences) != len(uncertainties)):
        raise ValueError("the smart gate replays from confidences, one per step")
    if GATES[gate].reads_first_token and (
        first_token_entropies is None or len(first_token_entropies) != len(uncertainties)
    ):
        raise ValueError(f"the {gate} gate replays from first_token_entropies, one per step")
    if draft_uncertainties is not None and len(draft_uncertainties) != len(uncertainties):
        raise ValueError("draft_uncertainties must have one entry per step")
    history = GateHistory()
    decisions: list[bool] = []
    for index, kept in enumerate(uncertainties):
        draft = draft_uncertainties[index] if draft_uncertainties is not None else None
        seen = kept if draft is None else draft
        decision = decide(
            gate,
            step=index + 1,
            uncertainty=seen,
            confidence=confidences[index] if confidences is not None else None,
            history=history,
            params=params,
            first_token_entropy=(
                first_token_entropies[index] if first_token_entropies is not None else None
            ),
        )
        decisions.append(decision.scale)
        history.commit(kept, alpha)
    return decisions
