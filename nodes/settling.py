"""When the traces drawn settle the question (no more are drawn): the settle rules, one
registry entry each, checked after every batch (live in graphs/traces.py, and in the replay
of recorded traces alike).

- agree: early-stopping self-consistency (Li et al., ICLR 2024, arXiv 2401.10480) with the
  batch as its window: the last batch's answers, two or more, are all one answer;
- consensus: DeepConf's adaptive sampling: the leader holds `consensus` of the vote's weight;
- beta: Adaptive-Consistency's Beta stop (Aggarwal et al., EMNLP 2023), which is also
  its_hub's Beta-posterior stop: with v1 >= v2 the two largest vote counts, the probability
  under Beta(v1 + 1, v2 + 1) that the leader's share of the two exceeds one half reaches
  `beta_confidence` (0.95 in both). With batches of one it is Adaptive-Consistency's check
  after every sample; its_hub fires every request at once and cancels the rest when it holds
  (its checks happen as replies arrive, so it pays for the cancelled requests' partial tokens);
- doubling: its_hub's adaptive self-consistency: batches double (2, 4, 8, ...) until the leader
  holds `consensus` of the votes (its_hub's default 0.75).

Stopped and unanswered traces never vote (as Adaptive-Consistency drops unparsable answers;
its_hub and ESC count them as an answer of their own).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mur.nodes.registry import Registry
from mur.nodes.voting import TraceOutcome, TraceRules, answer_key, tally


@dataclass(frozen=True)
class SettleRule:
    """One rule that says the traces drawn so far settle the question."""

    name: str
    settled: Callable[[Sequence[TraceOutcome], TraceRules], bool]
    description: str
    next_size: Callable[[int, TraceRules], int] | None = None
    """How many traces the next batch has, given how many are drawn (None: the batch)."""


def _agree(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> bool:
    last = outcomes[-_last_batch_size(len(outcomes), rules) :]
    answered = [o for o in last if not o.stopped and answer_key(o.answer)]
    keys = {answer_key(o.answer) for o in last if not o.stopped}
    return len(answered) >= 2 and len(keys) == 1 and "" not in keys


def _consensus(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> bool:
    result = tally(outcomes, rules)
    return len(result.voters) >= 2 and result.share >= rules.consensus


def _beta(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> bool:
    leader, runner_up = top_two_counts(outcomes)
    return leader_beats_runner_up(leader, runner_up) >= rules.beta_confidence


def _doubling(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> bool:
    leader, _ = top_two_counts(outcomes)
    voters = sum(1 for o in outcomes if not o.stopped and answer_key(o.answer))
    return voters >= 2 and leader / voters >= rules.consensus


SETTLE_RULES = Registry(
    "settle rule",
    SettleRule("never", lambda outcomes, rules: False, "draw every trace"),
    SettleRule("agree", _agree, "the last batch's answers, two or more, agree (ESC)"),
    SettleRule("consensus", _consensus, "the leader holds `consensus` of the vote (DeepConf)"),
    SettleRule(
        "beta",
        _beta,
        "P(leader beats the runner-up) >= beta_confidence (Adaptive-Consistency, its_hub)",
    ),
    SettleRule(
        "doubling",
        _doubling,
        "batches double until the leader holds `consensus` of the votes (its_hub)",
        next_size=lambda drawn, rules: drawn,
    ),
)


def top_two_counts(outcomes: Sequence[TraceOutcome]) -> tuple[int, int]:
    """The two largest answer counts among the traces that vote (0 where there is none)."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        key = answer_key(outcome.answer)
        if key and not outcome.stopped:
            counts[key] = counts.get(key, 0) + 1
    ranked = [*sorted(counts.values(), reverse=True), 0, 0]
    return ranked[0], ranked[1]


def leader_beats_runner_up(leader: int, runner_up: int) -> float:
    """P(theta > 1/2) for theta ~ Beta(leader + 1, runner_up + 1), exactly: the binomial tail
    1 - 2^-n * sum_{k <= runner_up} C(n, k), n = leader + runner_up + 1 (= 1 - I_0.5)."""
    if leader < 0 or runner_up < 0:
        raise ValueError(f"vote counts are >= 0, got {leader} and {runner_up}")
    n = leader + runner_up + 1
    tail = sum(math.comb(n, k) for k in range(runner_up + 1))
    return 1.0 - float(tail / 2**n)


def settled(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> bool:
    """Whether the traces so far settle the question (no more are drawn)."""
    return bool(outcomes) and SETTLE_RULES[rules.settle].settled(outcomes, rules)


def next_batch(outcomes: Sequence[TraceOutcome], rules: TraceRules) -> int:
    """How many traces to start now that `outcomes` are in (0: the question is done)."""
    if not outcomes:
        return rules.first_batch
    if len(outcomes) >= rules.traces or settled(outcomes, rules):
        return 0
    size = SETTLE_RULES[rules.settle].next_size
    wanted = size(len(outcomes), rules) if size else rules.trace_batch or rules.traces
    return min(wanted, rules.traces - len(outcomes))


def _last_batch_size(drawn: int, rules: TraceRules) -> int:
    first = rules.first_batch
    if drawn <= first:
        return drawn
    return (drawn - first - 1) % (rules.trace_batch or rules.traces) + 1
