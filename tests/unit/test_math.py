"""Uncertainty, momentum and the gates: pure functions, property-tested."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mur.nodes.gates import (
    GATES,
    GateHistory,
    GateParams,
    decide,
    mur_threshold,
    question_seed,
    replay_decisions,
)
from mur.nodes.uncertainty import (
    corrected_momentum,
    step_confidence,
    step_uncertainty,
    update_momentum,
)

logprob = st.floats(min_value=-20.0, max_value=0.0, allow_nan=False)
uncertainty = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
gamma = st.floats(min_value=0.05, max_value=50.0, allow_nan=False)


def test_step_uncertainty_is_mean_negative_logprob() -> None:
    assert step_uncertainty([-1.0, -2.0, -3.0]) == pytest.approx(2.0)
    assert step_confidence([0.0, math.log(0.5)]) == pytest.approx(0.75)


@pytest.mark.parametrize("fn", [step_uncertainty, step_confidence])
def test_empty_step_has_no_uncertainty(fn) -> None:
    with pytest.raises(ValueError, match="no generated tokens"):
        fn([])


@given(st.lists(logprob, min_size=1, max_size=50))
def test_uncertainty_and_confidence_ranges(lps: list[float]) -> None:
    m = step_uncertainty(lps)
    c = step_confidence(lps)
    assert m >= 0
    assert 0 < c <= 1 + 1e-12
    # Jensen: exp(-mean(-lp)) <= mean(exp(lp)).
    assert math.exp(-m) <= c + 1e-9


def test_momentum_update_and_bias_correction() -> None:
    assert update_momentum(0.0, 1.0, 0.9) == pytest.approx(0.1)
    assert update_momentum(0.5, 1.0, 0.5) == pytest.approx(0.75)
    # After one update from 0, the corrected momentum equals the first value.
    assert corrected_momentum(update_momentum(0.0, 2.0, 0.9), 1, 0.9) == pytest.approx(2.0)
    assert corrected_momentum(0.0, 0, 0.9) == 0.0


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_alpha_outside_open_interval_is_rejected(alpha: float) -> None:
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        update_momentum(0.0, 1.0, alpha)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        replay_decisions("mur", [1.0], alpha=alpha)


@pytest.mark.parametrize("bad_gamma", [0.0, -1.0, float("inf"), float("nan")])
def test_gamma_must_be_positive(bad_gamma: float) -> None:
    with pytest.raises(ValueError, match="gamma"):
        replay_decisions("mur", [1.0, 2.0], gamma=bad_gamma)


def test_unknown_gate_names_valid_ones() -> None:
    with pytest.raises(ValueError, match="never, always, mur, average, smart, first_token, random"):
        replay_decisions("sometimes", [1.0])


def test_mur_gate_by_hand() -> None:
    # m = [1.0, 1.2, 0.1]; M_1 = 0.1, threshold_2 = 0.1 - ln 0.9 = 0.2054 -> scale step 2.
    decisions = replay_decisions("mur", [1.0, 1.2, 0.1], alpha=0.9, gamma=0.9)
    assert decisions == [False, True, False]
    assert mur_threshold(0.1, 1, GateParams()) == pytest.approx(0.1 - math.log(0.9))


def test_bias_correction_raises_early_thresholds() -> None:
    # Raw momentum after step 1 is 0.1 * m_1; corrected it is m_1, so step 2 is not scaled.
    sequence = [1.0, 1.05]
    assert replay_decisions("mur", sequence) == [False, True]
    assert replay_decisions("mur", sequence, bias_correction=True) == [False, False]


@given(st.lists(uncertainty, min_size=1, max_size=30), gamma, gamma, st.booleans())
def test_raising_gamma_never_removes_a_scaled_step(seq, g1, g2, corrected) -> None:
    low, high = sorted((g1, g2))
    a = replay_decisions("mur", seq, gamma=low, bias_correction=corrected)
    b = replay_decisions("mur", seq, gamma=high, bias_correction=corrected)
    assert all(bb or not aa for aa, bb in zip(a, b, strict=True))


@given(st.lists(uncertainty, min_size=1, max_size=30), gamma, st.booleans())
def test_first_step_is_never_scaled_by_history_gates(seq, g, corrected) -> None:
    for gate in ("mur", "average", "random"):
        assert (
            replay_decisions(gate, seq, gamma=g, bias_correction=corrected, random_rate=1.0)[0]
            is False
        )


@given(st.lists(uncertainty, min_size=1, max_size=30))
def test_always_and_never(seq) -> None:
    assert replay_decisions("always", seq) == [True] * len(seq)
    assert replay_decisions("never", seq) == [False] * len(seq)


def test_average_gate_compares_with_mean_of_kept_steps() -> None:
    assert replay_decisions("average", [1.0, 3.0, 1.9, 2.1]) == [False, True, False, True]


def test_smart_gate_reads_confidences() -> None:
    assert replay_decisions("smart", [1, 1, 1], confidences=[0.95, 0.5, 0.9], tau=0.9) == [
        False,
        True,
        False,
    ]
    with pytest.raises(ValueError, match="confidences"):
        replay_decisions("smart", [1.0, 2.0])


@settings(max_examples=30)
@given(st.lists(uncertainty, min_size=2, max_size=40), st.integers(0, 2**31))
def test_random_gate_is_seeded_and_matches_rate_extremes(seq, seed) -> None:
    once = replay_decisions("random", seq, random_rate=0.5, seed=seed)
    assert once == replay_decisions("random", seq, random_rate=0.5, seed=seed)
    assert replay_decisions("random", seq, random_rate=0.0, seed=seed) == [False] * len(seq)
    assert replay_decisions("random", seq, random_rate=1.0, seed=seed) == [False] + [True] * (
        len(seq) - 1
    )


def test_each_question_draws_its_own_random_steps_at_the_rate() -> None:
    # With one seed for every question the gate scaled the same step numbers everywhere
    # (rate 0.218: steps 14 and 18 only). Mixed with the question, the share is the rate.
    questions = [f"Problem {k}: what is {k} + 1?" for k in range(400)]
    seeds = [question_seed(0, q) for q in questions]
    assert len(set(seeds)) == len(questions) and seeds[0] == question_seed(0, questions[0])
    assert question_seed(1, questions[0]) != seeds[0]
    decisions = [replay_decisions("random", [0.1] * 10, random_rate=0.218, seed=s) for s in seeds]
    share = sum(sum(d[1:]) for d in decisions) / (len(decisions) * 9)
    assert 0.19 < share < 0.25
    assert len({tuple(d) for d in decisions}) > 100  # patterns differ from question to question


def test_draft_uncertainties_replay_a_refined_trace() -> None:
    # Step 2's draft was uncertain (scaled), the refined step kept is calm: the momentum follows
    # the kept value, the decision the draft's.
    kept = [1.0, 0.2, 0.3]
    drafts = [None, 2.0, None]
    assert replay_decisions("mur", kept, draft_uncertainties=drafts) == [False, True, True]
    # Replaying the kept values alone loses the decision on step 2.
    assert replay_decisions("mur", kept) == [False, False, True]


def test_decide_matches_replay_for_every_gate() -> None:
    seq, confs = [0.5, 0.9, 0.2, 1.4, 0.7], [0.9, 0.6, 0.95, 0.4, 0.8]
    entropies = [0.3, 1.6, 0.2, 2.1, 0.9]
    for gate in GATES:
        params = GateParams(random_rate=0.5, seed=3)
        history, live = GateHistory(), []
        for i, (m, c, h) in enumerate(zip(seq, confs, entropies, strict=True), start=1):
            d = decide(gate, step=i, uncertainty=m, confidence=c, history=history,
                       params=params, first_token_entropy=h)  # fmt: skip
            live.append(d.scale)
            history.commit(m, params.alpha)
        replayed = replay_decisions(gate, seq, confidences=confs, random_rate=0.5, seed=3,
                                    first_token_entropies=entropies)  # fmt: skip
        assert live == replayed
