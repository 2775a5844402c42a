"""Selection rules and verdict parsing: pure functions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mur.nodes.judge import analysis_of, p_yes, parse_verdict, verdict_token_index
from mur.nodes.llm import Generation
from mur.nodes.select import (
    argmax_first,
    cluster_labels,
    foresight_weights,
    mean_logprob,
    sample_index,
    softmax,
)
from mur.nodes.thinking import cap_thinking, think_block


def judgement(tokens: list[str], logprobs: list[float], tops: dict[int, list[tuple[str, float]]]):
    return Generation(
        text="".join(tokens),
        logprobs=tuple(logprobs),
        tokens=tuple(tokens),
        top_logprobs=tuple(tuple(lp for _, lp in tops.get(i, [])) for i in range(len(tokens))),
        top_tokens=tuple(tuple(t for t, _ in tops.get(i, [])) for i in range(len(tokens))),
        finish_reason="stop",
    )


def test_p_yes_from_sampled_yes() -> None:
    g = judgement(
        ["Fine", ". \\", "boxed", "{", "Yes", "}"],
        [-1, -1, -1, -1, math.log(0.8), 0],
        {4: [("Yes", math.log(0.8)), ("No", math.log(0.15))]},
    )
    assert p_yes(g) == pytest.approx(0.8)


def test_p_yes_from_top_logprobs_when_no_was_sampled_and_spellings_sum() -> None:
    g = judgement(
        ["\\boxed{", "No", "}"],
        [0, math.log(0.6), 0],
        {1: [("No", math.log(0.6)), (" Yes", math.log(0.25)), ("yes", math.log(0.1))]},
    )
    assert p_yes(g) == pytest.approx(0.35)


def test_p_yes_without_verdict_is_zero() -> None:
    assert p_yes(judgement(["I", " think", " so"], [-1, -1, -1], {})) == 0.0
    assert verdict_token_index(["\\boxed{", "maybe", "}"]) is None


def test_verdict_and_analysis() -> None:
    text = "Step is wrong: 2+2=5. \\boxed{No}"
    assert parse_verdict(text) is False
    assert parse_verdict("ok \\boxed{ yes }") is True
    assert parse_verdict("no verdict") is None
    assert parse_verdict("\\boxed{No} then \\boxed{Yes}") is True
    assert analysis_of(text) == "Step is wrong: 2+2=5."


def test_argmax_ties_go_to_the_first() -> None:
    assert argmax_first([0.2, 0.7, 0.7]) == 1
    assert argmax_first([0.0, 0.0, 0.0]) == 0
    with pytest.raises(ValueError):
        argmax_first([])


@given(st.lists(st.floats(-50, 50), min_size=1, max_size=10))
def test_softmax_is_a_distribution(values: list[float]) -> None:
    weights = softmax(values)
    assert sum(weights) == pytest.approx(1.0)
    assert all(w >= 0 for w in weights)


def test_softmax_handles_minus_infinity() -> None:
    assert softmax([float("-inf"), 0.0]) == [0.0, 1.0]
    assert softmax([float("-inf")] * 2) == [0.5, 0.5]


def test_clustering_edge_cases() -> None:
    assert cluster_labels(["same", "same", "same"]) == [0, 0, 0]
    assert cluster_labels(["", "", "x y"]) in ([0, 0, 1], [1, 1, 0])
    assert cluster_labels(["", "", ""]) == [0, 0, 0]
    # Only punctuation and single characters: TF-IDF has no vocabulary.
    assert cluster_labels(["1", "2", "1"]) == [0, 1, 0]
    labels = cluster_labels(
        ["add the two numbers", "add the numbers", "divide by zero error", "divide by zero"]
    )
    assert labels[0] == labels[1] and labels[2] == labels[3] and labels[0] != labels[2]


def test_foresight_weights_combine_scores_and_cluster_sizes() -> None:
    weights = foresight_weights([0.0, 0.0, 0.0], [0, 0, 1])
    assert sum(weights) == pytest.approx(1.0)
    assert weights[0] == weights[1] > weights[2]
    with pytest.raises(ValueError):
        foresight_weights([0.0], [0, 1])


def test_sample_index_is_seeded() -> None:
    draws = {sample_index([0.1, 0.2, 0.7], seed) for seed in range(50)}
    assert draws == {0, 1, 2}
    assert sample_index([0.1, 0.2, 0.7], 7) == sample_index([0.1, 0.2, 0.7], 7)
    assert sample_index([0.0, 1.0], 3) == 1
    with pytest.raises(ValueError):
        sample_index([0.0, 0.0], 1)


def test_mean_logprob() -> None:
    assert mean_logprob([-1.0, -3.0]) == -2.0
    with pytest.raises(ValueError):
        mean_logprob([])


def test_thinking_cap_keeps_whole_sentences() -> None:
    text = "First idea. Second idea! Third is cut mid"
    assert cap_thinking(text, hit_cap=True) == "First idea. Second idea!"
    assert cap_thinking(text, hit_cap=False) == text
    assert cap_thinking("no sentence end at all", hit_cap=True) == "no sentence end at all"
    assert cap_thinking("x = 3.5 is it", hit_cap=True) == "x = 3.5 is it"
    block = think_block("add them.", "prefix")
    assert block.startswith("<think>\nOkay, so I need to add them.")
    assert block.endswith("</think>\n\n")
    assert think_block("<think>\nhmm.", "qwen3") == "<think>\nhmm.\n</think>\n\n"


def test_end_of_sequence_without_vllm_stop_reason() -> None:
    def gen(text: str, tokens: list[str]) -> Generation:
        return Generation(
            text=text,
            logprobs=tuple([-0.1] * len(tokens)),
            tokens=tuple(tokens),
            top_logprobs=((),) * len(tokens),
            top_tokens=((),) * len(tokens),
            finish_reason="stop",
            stops=("\nStep", "Step3:"),
        )

    assert gen(" add 2", [" add", " 2", "\n", "Step"]).ended_by_model is False
    assert gen(" add 2", [" add", " 2", " Step", "3", ":"]).ended_by_model is False
    assert gen(" add 2", [" add", " 2", "<|im_end|>"]).ended_by_model is True
    assert gen(" add 2", [" add", " 2"]).ended_by_model is True
