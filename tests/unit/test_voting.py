"""The trace rules as pure functions: DeepConf's confidences, the votes, the settle rules, the
batches and the stop thresholds (nodes.confidence, nodes.voting)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from scipy.special import betainc

from mur.nodes.confidence import (
    GroupWatch,
    TraceConfidence,
    first_breach,
    group_confidences,
    token_confidence,
    trace_confidence,
)
from mur.nodes.settling import leader_beats_runner_up, next_batch, settled, top_two_counts
from mur.nodes.trace_stop import should_stop, stop_threshold
from mur.nodes.voting import TraceOutcome, TraceRules, answer_key, tally


def outcome(
    index: int,
    answer: str | None,
    *,
    momentum: float = 1.0,
    lowest: float | None = 10.0,
    stopped: bool = False,
    tokens: int = 100,
) -> TraceOutcome:
    return TraceOutcome(
        index, answer, momentum, TraceConfidence(lowest, lowest, lowest, lowest), tokens, stopped
    )


# ---------------------------------------------------------------------------- confidence


def test_token_confidence_is_minus_the_mean_top_logprob_rounded() -> None:
    assert token_confidence([-0.1, -2.0, -3.9]) == 2.0
    assert token_confidence([-1 / 3]) == 0.333
    assert token_confidence([-math.inf, 0.0]) == 5000.0  # -inf counts as the logprob floor
    with pytest.raises(ValueError, match="top_logprobs"):
        token_confidence([])


def test_groups_are_full_sliding_windows_or_one_short_trace() -> None:
    assert group_confidences([1.0, 2.0, 3.0, 4.0], 2) == [1.5, 2.5, 3.5]
    assert group_confidences([1.0, 2.0], 4) == [1.5]
    assert group_confidences([], 4) == []
    with pytest.raises(ValueError, match="window"):
        group_confidences([1.0], 0)


def test_trace_confidence_measures() -> None:
    confidences = [float(c) for c in range(1, 21)]  # groups of 2: 1.5 ... 19.5
    measures = trace_confidence(confidences, window=2, tail=4)
    assert measures.lowest_group == 1.5
    assert measures.bottom_10 == 2.0  # the lowest 2 of 19 groups: 1.5 and 2.5
    assert measures.tail == 18.5
    assert measures.mean == 10.5
    assert trace_confidence([], window=2, tail=4) == TraceConfidence(None, None, None, None)


def test_the_live_watch_and_the_offline_breach_agree() -> None:
    confidences = [5.0, 5.0, 1.0, 1.0, 5.0]
    watch = GroupWatch(2)
    groups = [watch.push(c) for c in confidences]
    assert groups == [None, 5.0, 3.0, 1.0, 3.0]
    assert first_breach(confidences, 2.5, 2) == 3
    assert first_breach(confidences, 0.5, 2) is None


# ---------------------------------------------------------------------------- votes


def test_answer_key_merges_spellings_of_one_answer() -> None:
    assert answer_key("\\dfrac{1}{2}") == answer_key("$\\frac{1} {2}$") == "\\frac{1}{2}"
    assert answer_key("\\text{(B)}") == answer_key("(B).") == "(B)"
    assert answer_key("90^\\circ") == "90"
    assert answer_key(None) == answer_key("") == ""
    assert answer_key("0.5") != answer_key("\\frac{1}{2}")  # string work only


def test_majority_vote_ties_go_to_the_answer_given_first() -> None:
    rules = TraceRules(traces=4)
    votes = [outcome(0, "7"), outcome(1, "42"), outcome(2, "42"), outcome(3, "7")]
    assert tally(votes, rules).answer == "7"
    assert tally([*votes, outcome(4, "$42$")], rules).answer == "42"


def test_stopped_and_unanswered_traces_do_not_vote() -> None:
    votes = [outcome(0, "1", stopped=True), outcome(1, None), outcome(2, "2")]
    result = tally(votes, TraceRules(traces=3))
    assert (result.answer, result.voters) == ("2", (2,))
    assert tally([outcome(0, None)], TraceRules()).answer is None


def test_momentum_and_confidence_weights() -> None:
    votes = [outcome(0, "a", momentum=0.1, lowest=2.0), outcome(1, "b", momentum=3.0, lowest=9.0)]
    votes.append(outcome(2, "b", momentum=3.0, lowest=9.0))
    assert tally(votes, TraceRules(traces=3)).answer == "b"  # two votes to one
    momentum = tally(votes, TraceRules(traces=3, vote="momentum"))
    assert momentum.answer == "a"  # exp(-0.1) > 2 exp(-3)
    assert momentum.weights["a"] == pytest.approx(math.exp(-0.1))
    assert tally(votes, TraceRules(traces=3, vote="confidence")).answer == "b"


def test_vote_keep_filters_the_lowest_ranked_traces() -> None:
    votes = [outcome(0, "a", lowest=1.0), outcome(1, "a", lowest=2.0), outcome(2, "b", lowest=9.0)]
    rules = TraceRules(traces=3, vote="confidence", vote_keep=0.3)
    result = tally(votes, rules)
    assert (result.answer, result.voters) == ("b", (2,))
    assert tally(votes, replace(rules, vote_keep=1.0)).answer == "b"  # weights 1 + 2 < 9
    assert tally(votes, replace(rules, vote="majority", vote_keep=1.0)).answer == "a"


# ---------------------------------------------------------------------------- batches


def test_all_traces_at_once_by_default() -> None:
    rules = TraceRules(traces=8)
    assert next_batch([], rules) == 8
    assert next_batch([outcome(i, "x") for i in range(8)], rules) == 0


def test_agree_settles_when_the_last_batch_agrees() -> None:
    rules = TraceRules(traces=8, trace_batch=2, settle="agree")
    assert next_batch([], rules) == 2
    assert next_batch([outcome(0, "1"), outcome(1, "1")], rules) == 0
    split = [outcome(0, "1"), outcome(1, "2")]
    assert next_batch(split, rules) == 2
    assert next_batch([*split, outcome(2, "3"), outcome(3, "3")], rules) == 0
    # A stopped trace leaves one answer in its batch: not settled.
    assert not settled([*split, outcome(2, "3"), outcome(3, "3", stopped=True)], rules)
    assert next_batch([outcome(i, str(i)) for i in range(7)], rules) == 1  # capped at 8


def test_consensus_needs_two_voters_and_the_share() -> None:
    rules = TraceRules(traces=8, trace_batch=1, settle="consensus", consensus=0.7)
    assert not settled([outcome(0, "1")], rules)
    assert settled([outcome(0, "1"), outcome(1, "1")], rules)
    assert not settled([outcome(0, "1"), outcome(1, "1"), outcome(2, "2")], rules)  # 0.67
    votes = [outcome(0, "1"), outcome(1, "1"), outcome(2, "2"), outcome(3, "1")]
    assert settled(votes, rules)


@pytest.mark.parametrize(
    ("leader", "runner_up", "probability"),
    # Adaptive-Consistency's and its_hub's Beta stop, as their own tests and paper tabulate it
    [
        (1, 0, 0.75),
        (3, 0, 0.9375),
        (4, 0, 0.96875),
        (6, 1, 0.96484),
        (7, 2, 0.94531),
        (9, 3, 0.95386),
        (5, 5, 0.5),
    ],
)
def test_the_beta_stop_is_the_posterior_that_the_leader_beats_the_runner_up(
    leader: int, runner_up: int, probability: float
) -> None:
    assert leader_beats_runner_up(leader, runner_up) == pytest.approx(probability, abs=5e-6)
    # the same as 1 - I_0.5(v1 + 1, v2 + 1), the regularized incomplete beta
    assert leader_beats_runner_up(leader, runner_up) == pytest.approx(
        1 - betainc(leader + 1, runner_up + 1, 0.5), abs=1e-12
    )


def test_beta_settles_after_four_agreeing_answers_at_0_95() -> None:
    rules = TraceRules(traces=8, trace_batch=1, settle="beta", beta_confidence=0.95)
    agreeing = [outcome(i, "7") for i in range(4)]
    assert [settled(agreeing[:k], rules) for k in range(1, 5)] == [False, False, False, True]
    # a dissenting answer, a stopped trace and an unanswered one: 4 to 1 is not enough
    mixed = [*agreeing, outcome(4, "8"), outcome(5, "9", stopped=True), outcome(6, None)]
    assert top_two_counts(mixed) == (4, 1)
    assert not settled(mixed, rules)
    assert settled([*mixed, outcome(7, "7"), outcome(8, "7")], rules)  # 6 to 1: 0.965


def test_doubling_draws_2_4_8_until_the_leader_holds_its_share() -> None:
    rules = TraceRules(traces=16, trace_batch=2, settle="doubling", consensus=0.75)
    assert next_batch([], rules) == 2
    split = [outcome(0, "1"), outcome(1, "2")]
    assert next_batch(split, rules) == 2  # 2 drawn: 2 more
    four = [*split, outcome(2, "1"), outcome(3, "2")]
    assert next_batch(four, rules) == 4  # 4 drawn, no leader: 4 more
    eight = [*four, *(outcome(i, "1") for i in range(4, 8))]
    assert next_batch(eight, rules) == 0  # 6 of 8 = 0.75: settled
    assert next_batch([outcome(i, str(i)) for i in range(12)], rules) == 4  # capped at 16


# ---------------------------------------------------------------------------- stopping


def test_thresholds_come_from_the_warmup() -> None:
    warmup = [outcome(0, "a", momentum=1.0, lowest=4.0), outcome(1, "b", momentum=3.0, lowest=8.0)]
    rules = TraceRules(traces=4, trace_batch=2, trace_stop="momentum", stop_keep=1.0)
    assert stop_threshold(warmup, rules) == 3.0  # the larger final momentum
    assert stop_threshold(warmup, replace(rules, stop_keep=0.5)) == 2.0
    confidence = replace(rules, trace_stop="confidence", stop_keep=0.9)
    assert stop_threshold(warmup, confidence) == pytest.approx(4.4)  # the 10% quantile
    assert stop_threshold(warmup, replace(rules, trace_stop="none")) is None
    assert stop_threshold([outcome(0, "a", lowest=None)], confidence) is None


def test_should_stop_reads_momentum_or_any_full_window() -> None:
    momentum = TraceRules(traces=4, trace_batch=2, trace_stop="momentum")
    assert should_stop(momentum, 2.0, momentum=2.5, confidences=[])
    assert not should_stop(momentum, 2.0, momentum=2.0, confidences=[])
    assert not should_stop(momentum, None, momentum=9.0, confidences=[])
    confidence = replace(momentum, trace_stop="confidence", group_window=2)
    assert should_stop(confidence, 3.0, momentum=0.0, confidences=[5.0, 0.5, 5.0])
    assert not should_stop(confidence, 3.0, momentum=0.0, confidences=[5.0, 4.0, 5.0])
