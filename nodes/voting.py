"""Many traces, one answer: the vote rules, the rule that says when to draw more traces, and
the rule that stops a trace part-way. Pure functions of numbers and answers, so the graph's
live run (graphs/traces.py) and the replay of recorded traces (evals/report/traces.py) decide
alike.

A question is solved in batches of traces: the first batch (the warm-up) runs in full and
sets the stop threshold; each later batch runs with the stop rule, until the settle rule says
the leading answer is settled or `traces` are drawn. A stopped trace has no vote (DeepConf).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mur.nodes.confidence import TraceConfidence, first_breach

VoteName = Literal["majority", "momentum", "confidence"]
SettleName = Literal["never", "agree", "consensus"]
StopName = Literal["none", "momentum", "confidence"]
MeasureName = Literal["lowest_group", "bottom_10", "tail", "mean"]


@dataclass(frozen=True)
class TraceRules:
    """The trace-level settings of a run (graphs.Context holds and describes each one)."""

    traces: int = 1
    batch: int | None = None  # None: all traces at once
    vote: VoteName = "majority"
    vote_keep: float = 1.0
    measure: MeasureName = "lowest_group"
    settle: SettleName = "never"
    consensus: float = 0.95
    stop: StopName = "none"
    stop_keep: float = 0.9
    window: int = 64

    @property
    def first_batch(self) -> int:
        return min(self.batch or self.traces, self.traces)


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


def vote_weight(outcome: TraceOutcome, rules: TraceRules) -> float:
    """A ballot's weight: 1 (majority), exp(-final momentum) (MUR's) or the trace's
    confidence by the rules' measure (DeepConf's)."""
    if rules.vote == "majority":
        return 1.0
    if rules.vote == "momentum":
        return math.exp(-outcome.momentum)
    return max(trace_score(outcome, rules.measure), 0.0)


def ranking(outcome: TraceOutcome, rules: TraceRules) -> float:
    """How the top-`vote_keep` filter ranks traces: by momentum (lower first) for the momentum
    vote, else by confidence."""
    if rules.vote == "momentum":
        return -outcome.momentum
    return trace_score(outcome, rules.measure)


def tally(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> Tally:
    """The vote over the traces that finished with an answer, after keeping the top
    `vote_keep` of them by `ranking` (at least one). Ties go to the answer given first."""
    voting = [o for o in outcomes if not o.stopped and answer_key(o.answer)]
    if rules.vote_keep < 1.0 and voting:
        keep = max(1, math.ceil(len(voting) * rules.vote_keep))
        voting = sorted(voting, key=lambda o: (-ranking(o, rules), o.index))[:keep]
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


# ---------------------------------------------------------------------------- drawing


def settled(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> bool:
    """Whether the traces so far settle the question (no more are drawn).

    never: draw them all. agree (early-stopping self-consistency, window = the batch): the
    last batch's answered traces, at least two, all give one answer. consensus (DeepConf's
    adaptive sampling): two or more traces voted and the leading answer holds at least
    `consensus` of the vote's weight.
    """
    if rules.settle == "never" or not outcomes:
        return False
    if rules.settle == "agree":
        last = outcomes[-_last_batch_size(len(outcomes), rules) :]
        keys = {answer_key(o.answer) for o in last if not o.stopped}
        answered = [o for o in last if not o.stopped and answer_key(o.answer)]
        return len(answered) >= 2 and len(keys) == 1 and "" not in keys
    result = tally(outcomes, rules)
    return len(result.voters) >= 2 and result.share >= rules.consensus


def _last_batch_size(drawn: int, rules: TraceRules) -> int:
    first = rules.first_batch
    if drawn <= first:
        return drawn
    return (drawn - first - 1) % (rules.batch or rules.traces) + 1


def next_batch(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> int:
    """How many traces to start now that `outcomes` are in (0: the question is done)."""
    if not outcomes:
        return rules.first_batch
    if len(outcomes) >= rules.traces or settled(outcomes, rules):
        return 0
    return min(rules.batch or rules.traces, rules.traces - len(outcomes))


# ---------------------------------------------------------------------------- stopping


def stop_threshold(warmup: Sequence[TraceOutcome], rules: TraceRules) -> float | None:
    """The stop rule's threshold, from the warm-up traces (None: no stopping).

    confidence (DeepConf online): the (1 - stop_keep) quantile of the warm-ups' lowest group
    confidence; a later trace stops once a group falls below it. momentum (MUR's): the
    stop_keep quantile of the warm-ups' final momentum; a later trace stops once its momentum
    rises above it. stop_keep 0.9 keeps about nine in ten traces like the warm-ups.
    """
    if rules.stop == "none" or not warmup:
        return None
    if rules.stop == "momentum":
        return float(np.quantile([o.momentum for o in warmup], rules.stop_keep))
    lows = [o.confidence.lowest_group for o in warmup if o.confidence.lowest_group is not None]
    if not lows:
        return None
    return float(np.quantile(lows, 1.0 - rules.stop_keep))


def should_stop(
    rules: TraceRules,
    threshold: float | None,
    *,
    momentum: float,
    confidences: Sequence[float],
) -> bool:
    """The stop rule after a step: the trace's momentum so far, or its token confidences so
    far (every full window among them), against the threshold."""
    if threshold is None or rules.stop == "none":
        return False
    if rules.stop == "momentum":
        return momentum > threshold
    return first_breach(confidences, threshold, rules.window) is not None
