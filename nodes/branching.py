"""Where a later trace branches off an earlier one: pure rules over the parent's step records.

A branch keeps its parent's steps before the branch point and draws the rest afresh, so the
prefix is paid for once (and vLLM's prefix cache serves it). Which point is a rule of the
registry below (nodes.registry), one entry each: MUR's (the step whose uncertainty jumps
furthest above the gamma-gate's threshold from the momentum before it, or the first step the
gate flags), a random step (the control), and EAGer's (Scalena et al., arXiv 2510.11170: the
first token whose top-k entropy exceeds a threshold, branching inside the step).

Every rule orders all of a parent's candidate points; the n-th branch of a question takes
parent n mod P (P parents: the first batch of traces) and that parent's (n div P)-th point,
cycling when it has fewer. The graph's live run (graphs/traces.py) and any replay call
`plan_branch` alike.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mur.nodes.gates import GateParams, derive_seed, mur_threshold
from mur.nodes.registry import Registry


@dataclass(frozen=True)
class Spike:
    """A token of a step whose top-k entropy exceeded the run's threshold: its index among the
    step's generated tokens, the characters of the step's text before it, its entropy."""

    token: int
    chars: int
    entropy: float


@dataclass(frozen=True)
class ParentStep:
    """What the branch rules read of one kept step of a parent trace."""

    uncertainty: float
    momentum_before: float
    spikes: tuple[Spike, ...] = ()


@dataclass(frozen=True)
class BranchPoint:
    """Where a branch starts: it keeps `parent`'s steps before `step` and draws `step` afresh;
    a token-level point also keeps the first `chars` characters of `step` (its tokens before
    `token`) and draws from there."""

    parent: int
    step: int
    token: int | None = None
    chars: int = 0


@dataclass(frozen=True)
class BranchParams:
    """The numbers the rules read: the gamma-gate's (MUR's excess) and the question's seed
    (the random rule's draws)."""

    gate: GateParams


PointRule = Callable[[int, Sequence[ParentStep], BranchParams], list[BranchPoint]]


@dataclass(frozen=True)
class BranchRule:
    """One way to pick branch points: all of a parent's points, best first."""

    name: str
    points: PointRule
    description: str
    reads_entropy: bool = False
    """It reads the tokens' entropy spikes, which are recorded only with top_logprobs."""


def mur_excess(steps: Sequence[ParentStep], params: GateParams) -> list[tuple[int, float]]:
    """(step, excess) for steps 2..n: m_t minus the gamma-gate's threshold from the momentum
    before step t (step 1 has no momentum to compare with, as the gate)."""
    return [
        (t, step.uncertainty - mur_threshold(step.momentum_before, t - 1, params))
        for t, step in enumerate(steps, start=1)
        if t >= 2
    ]


def _mur_max(parent: int, steps: Sequence[ParentStep], params: BranchParams) -> list[BranchPoint]:
    ranked = sorted(mur_excess(steps, params.gate), key=lambda pair: (-pair[1], pair[0]))
    return [BranchPoint(parent, t) for t, _ in ranked]


def _mur_first(parent: int, steps: Sequence[ParentStep], params: BranchParams) -> list[BranchPoint]:
    excess = mur_excess(steps, params.gate)
    flagged = [t for t, e in excess if e > 0]
    rest = sorted(((t, e) for t, e in excess if e <= 0), key=lambda pair: (-pair[1], pair[0]))
    return [BranchPoint(parent, t) for t in [*flagged, *(t for t, _ in rest)]]


def _random(parent: int, steps: Sequence[ParentStep], params: BranchParams) -> list[BranchPoint]:
    candidates = list(range(2, len(steps) + 1))
    random.Random(derive_seed(params.gate.seed, parent)).shuffle(candidates)
    return [BranchPoint(parent, t) for t in candidates]


def _eager(parent: int, steps: Sequence[ParentStep], params: BranchParams) -> list[BranchPoint]:
    return [
        BranchPoint(parent, t, spike.token, spike.chars)
        for t, step in enumerate(steps, start=1)
        for spike in step.spikes
    ]


BRANCH_RULES = Registry(
    "branch rule",
    BranchRule("none", lambda *_: [], "no branching: every trace starts afresh"),
    BranchRule(
        "mur_max",
        _mur_max,
        "MUR: the step whose uncertainty most exceeds the gamma-gate's threshold",
    ),
    BranchRule(
        "mur_first", _mur_first, "MUR: the first step the gamma-gate flags (then by excess)"
    ),
    BranchRule("random", _random, "a uniformly random step (2..n) of the parent"),
    BranchRule(
        "eager",
        _eager,
        "EAGer: the first token whose top-k entropy exceeds branch_entropy",
        reads_entropy=True,
    ),
)


def branch_points(
    parent: int, steps: Sequence[ParentStep], rule: str, params: BranchParams
) -> list[BranchPoint]:
    """Every point `rule` finds in trace `parent` (its kept `steps`), best first."""
    return BRANCH_RULES[rule].points(parent, steps, params)


def plan_branch(
    n: int, parents: Sequence[Sequence[ParentStep]], rule: str, params: BranchParams
) -> BranchPoint | None:
    """Where the n-th branch (from 0) of a question starts: parent n mod len(parents), its
    (n div len(parents))-th point in the rule's order, cycling; None: no branching, or the
    parent has no point (the trace then starts afresh)."""
    if n < 0:
        raise ValueError(f"branches are numbered from 0, got {n}")
    if not parents:
        return None
    parent = n % len(parents)
    points = branch_points(parent, parents[parent], rule, params)
    if not points:
        return None
    return points[(n // len(parents)) % len(points)]
