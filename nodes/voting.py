"""Many traces, one answer: the trace-level settings, what the rules read of a trace, and the
votes. Pure functions of numbers and answers, so the graph's live run (graphs/traces.py) and
the replay of recorded traces (evals/report/traces.py) decide alike.

A question is solved in batches of traces: the first batch (the warm-up) runs in full and
sets the stop threshold; each later batch runs with the stop rule (nodes.trace_stop), until
the settle rule (nodes.settling) says the leading answer is settled or `traces` are drawn; later
traces may branch off the warm-up's (nodes.branching). A stopped trace has no vote (DeepConf).
Each kind of rule is a registry (nodes.registry), one entry per rule, as the gates are:
Context's choices, the flags and Studio's read the names from there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from mur.nodes.confidence import TraceConfidence
from mur.nodes.registry import Registry

MeasureName = Literal["lowest_group", "bottom_10", "tail", "mean"]


@dataclass(frozen=True)
class TraceRules:
    """The trace-level settings of a run: graphs.Context's fields of the same names, which
    describe each one."""

    traces: int = 1
    trace_batch: int | None = None  # None: all traces at once
    vote: str = "majority"
    vote_keep: float = 1.0
    confidence_measure: MeasureName = "lowest_group"
    settle: str = "never"
    consensus: float = 0.95
    beta_confidence: float = 0.95
    trace_stop: str = "none"
    stop_keep: float = 0.9
    group_window: int = 64

    @property
    def first_batch(self) -> int:
        return min(self.trace_batch or self.traces, self.traces)


@dataclass(frozen=True)
class TraceOutcome:
    """What the rules read of one finished or stopped trace."""

    index: int
    answer: str | None
    momentum: float
    confidence: TraceConfidence
    tokens: int
    stopped: bool = False


@dataclass(frozen=True)
class Tally:
    """The vote: the winning answer (None: no trace answered), each answer's weight and the
    traces that voted."""

    answer: str | None
    weights: dict[str, float]
    voters: tuple[int, ...]

    @property
    def share(self) -> float:
        """The winner's share of the weight (0 without votes)."""
        total = math.fsum(self.weights.values())
        return self.weights[answer_key(self.answer)] / total if self.answer and total else 0.0


# ---------------------------------------------------------------------------- answers

_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_NOISE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\ |\^\{?\\circ\}?|\$")


def answer_key(answer: str | None) -> str:
    """What two answers share when they count as one vote: the text without spacing, math
    delimiters, \\text{} wrappers, \\left/\\right, degree signs and a final period, with
    \\dfrac and \\tfrac read as \\frac. String work only: the vote must be cheap, total and
    the same live and in replay; equivalences it misses (0.5 and 1/2) split a vote."""
    if not answer:
        return ""
    text = _WRAPPERS.sub(r"\1", answer)
    text = _NOISE.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return "".join(text.split()).rstrip(".")


# ---------------------------------------------------------------------------- voting


def trace_score(outcome: TraceOutcome, measure: MeasureName) -> float:
    """DeepConf's confidence of a trace by `measure` (higher: surer; -inf without tokens)."""
    value = getattr(outcome.confidence, measure)
    return -math.inf if value is None else float(value)


@dataclass(frozen=True)
class Vote:
    """One way to weigh the traces' ballots."""

    name: str
    weight: Callable[[TraceOutcome, TraceRules], float]
    rank: Callable[[TraceOutcome, TraceRules], float]
    """How the top-`vote_keep` filter ranks traces (higher first)."""
    description: str
    reads_confidence: bool = False
    """Its weights read token confidences (top_logprobs)."""
    ranks_by_confidence: bool = False
    """Its vote_keep filter ranks by confidence (top_logprobs when vote_keep < 1)."""


VOTES = Registry(
    "vote",
    Vote(
        "majority",
        lambda outcome, rules: 1.0,
        lambda outcome, rules: trace_score(outcome, rules.confidence_measure),
        "one vote each (self-consistency)",
        ranks_by_confidence=True,
    ),
    Vote(
        "momentum",
        lambda outcome, rules: math.exp(-outcome.momentum),
        lambda outcome, rules: -outcome.momentum,
        "weighted by exp(-final momentum) (MUR's)",
    ),
    Vote(
        "confidence",
        lambda outcome, rules: max(trace_score(outcome, rules.confidence_measure), 0.0),
        lambda outcome, rules: trace_score(outcome, rules.confidence_measure),
        "weighted by DeepConf's confidence_measure",
        reads_confidence=True,
        ranks_by_confidence=True,
    ),
)


def vote_weight(outcome: TraceOutcome, rules: TraceRules) -> float:
    """A ballot's weight under the rules' vote."""
    return VOTES[rules.vote].weight(outcome, rules)


def tally(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> Tally:
    """The vote over the traces that finished with an answer, after keeping the top
    `vote_keep` of them by the vote's rank (at least one). Ties go to the answer given first."""
    voting = [o for o in outcomes if not o.stopped and answer_key(o.answer)]
    if rules.vote_keep < 1.0 and voting:
        keep = max(1, math.ceil(len(voting) * rules.vote_keep))
        rank = VOTES[rules.vote].rank
        voting = sorted(voting, key=lambda o: (-rank(o, rules), o.index))[:keep]
    weights: dict[str, float] = {}
    first: dict[str, tuple[int, str]] = {}
    for outcome in sorted(voting, key=lambda o: o.index):
        key = answer_key(outcome.answer)
        weights[key] = weights.get(key, 0.0) + vote_weight(outcome, rules)
        first.setdefault(key, (outcome.index, outcome.answer or ""))
    if not weights:
        return Tally(None, {}, ())
    best = max(weights, key=lambda key: (weights[key], -first[key][0]))
    return Tally(first[best][1], weights, tuple(sorted(o.index for o in voting)))
