"""GenPRM-1.5B's judgement format: verdict, P(Yes) and the analysis fed back, read right.

GenPRM writes `<analyze>` (an analysis), `<verify>` (python code and its output), then
`<output>\n**Judgement**: $\\boxed{Yes}$\n</output>`. The fixtures follow that published format
(the section openers are GenPRM's own templates); the tokens of the output section are split
the way Qwen2.5's tokenizer (GenPRM's) splits them.
"""

from __future__ import annotations

import math
import re

import pytest

from fakes import FakeLogprobChat, Scripted
from mur.nodes.judge import (
    FORCED_VERDICT_MAX_TOKENS,
    JUDGEMENT_END,
    analysis_of,
    judge_step,
    p_yes,
    parse_verdict,
)
from mur.nodes.judge import verdict_token_index as verdict_at
from mur.nodes.llm import CONTINUE_FINAL_MESSAGE, Generation
from mur.prompts.mur import FORCED_VERDICT

ANALYSIS = (
    "<analyze>\nLet's analyze the Paragraph 2 step by step: the paragraph adds 2 and 3 and "
    "writes $\\boxed{5}$. No error appears in the arithmetic, and the sum matches the "
    "question.\n</analyze>\n"
    "<verify>\nLet's use python code to find any potential error:\n```python\n"
    "print(2 + 3)  # No surprises expected\n```\n[Code Output]\n\n```\n5\n```\n"
    "The output agrees with the paragraph.\n</verify>\n"
)


def output_section(word: str) -> list[str]:
    """`<output>\n**Judgement**: $\\boxed{WORD}$\n</output>\n` as Qwen2.5's tokenizer splits it
    (the stop string `</output>` is cut from the text, its tokens stay in the logprobs)."""
    opening = ["<", "output", ">\n", "**", "Jud", "gement", "**:", " $\\", "boxed", "{"]
    return [*opening, word, "}", "$\n", "</", "output", ">\n"]


def words(text: str) -> list[str]:
    """A plain split for the analysis part (its exact tokens do not matter here)."""
    return re.findall(r"\s*\S+|\s+", text)


def reply(tokens: list[str], verdict_at_index: int | None, p: float, other: float) -> Generation:
    """Sampled token logprob -0.1 everywhere except the verdict, which carries top logprobs."""
    logprobs = [-0.1] * len(tokens)
    tops: list[tuple[tuple[str, float], ...]] = [() for _ in tokens]
    if verdict_at_index is not None:
        sampled = tokens[verdict_at_index]
        alternative = "No" if sampled == "Yes" else "Yes"
        logprobs[verdict_at_index] = math.log(p)
        tops[verdict_at_index] = (
            (sampled, math.log(p)),
            (alternative, math.log(other)),
            (" " + alternative, math.log(0.001)),
        )
    text = "".join(tokens).removesuffix("</output>\n")
    return Generation(
        text=text,
        logprobs=tuple(logprobs),
        tokens=tuple(tokens),
        top_logprobs=tuple(tuple(lp for _, lp in top) for top in tops),
        top_tokens=tuple(tuple(t for t, _ in top) for top in tops),
        finish_reason="stop",
    )


def test_yes_after_an_analysis_with_boxed_math_and_the_word_no() -> None:
    tokens = words(ANALYSIS) + output_section("Yes")
    index = len(tokens) - 6
    assert tokens[index] == "Yes"
    judged = reply(tokens, index, p=0.93, other=0.06)
    assert parse_verdict(judged.text) is True
    assert verdict_at(judged.tokens) == index
    assert p_yes(judged) == pytest.approx(0.93)


def test_no_verdict_reads_p_yes_from_the_alternatives() -> None:
    tokens = words(ANALYSIS) + output_section("No")
    index = len(tokens) - 6
    judged = reply(tokens, index, p=0.7, other=0.25)
    assert parse_verdict(judged.text) is False
    assert verdict_at(judged.tokens) == index
    # " Yes" (0.001) is another spelling of Yes: both count.
    assert p_yes(judged) == pytest.approx(0.251)


def test_a_judgement_cut_before_its_output_section_has_no_verdict() -> None:
    cut = ANALYSIS.split("[Code Output]")[0]  # the token cap hit inside <verify>
    judged = reply(words(cut), None, p=1.0, other=0.0)
    assert "\\boxed{5}" in judged.text and " No" in judged.text
    assert parse_verdict(judged.text) is None
    assert verdict_at(judged.tokens) is None
    assert p_yes(judged) == 0.0


def test_the_analysis_fed_back_is_genprm_analysis_and_code_check() -> None:
    text = ANALYSIS + "<output>\n**Judgement**: $\\boxed{No}$\n"
    fed_back = analysis_of(text)
    assert fed_back.startswith("Let's analyze the Paragraph 2 step by step: the paragraph adds")
    assert "[Code Output]\n\n```\n5\n```" in fed_back
    assert fed_back.endswith("The output agrees with the paragraph.")
    for gone in ("<analyze>", "</verify>", "<output>", "Judgement", "\\boxed{No}"):
        assert gone not in fed_back
    assert "$\\boxed{5}$" in fed_back  # the paragraph's own math stays


@pytest.mark.parametrize(
    ("text", "verdict", "analysis"),
    [
        ("**Judgement**: $\\boxed{\\text{No}}$", False, ""),
        ("Fine so far. \\boxed{ yes }", True, "Fine so far."),
        ("\\boxed{No} at first; on reflection \\boxed{Yes}", True, "at first; on reflection"),
    ],
)
def test_verdict_spellings(text: str, verdict: bool, analysis: str) -> None:
    assert parse_verdict(text) is verdict
    assert analysis_of(text) == analysis


def test_a_bare_yes_or_no_counts_only_as_the_last_word() -> None:
    # Qwen2.5-Coder-1.5B as critic answered "Yes", "Yes." or "No" in 5% of its judgements: a
    # Yes must keep the step, as its P(Yes) already said.
    for text, verdict in [("Yes", True), ("Yes.", True), ("No", False), ("fine: No\n", False)]:
        assert parse_verdict(text) is verdict
    for text in ("Yes, but step 3 is wrong", "No error found so far", "\\[ d = \\sqrt{145} \\]"):
        assert parse_verdict(text) is None
    assert verdict_at(["Yes", "."]) == 0
    assert verdict_at(["The", " step", " is", " fine", ":", " No", "<|im_end|>"]) == 5
    assert verdict_at(["Yes", ",", " but", " step", " 3", " is", " wrong"]) is None
    assert verdict_at(["No", " error", " found", " so", " far"]) is None


async def test_judge_request_stops_at_the_end_of_the_output_section() -> None:
    tokens = words(ANALYSIS) + output_section("Yes")
    index = len(tokens) - 6
    logprobs = [-0.1] * len(tokens)
    logprobs[index] = math.log(0.8)
    tops = [[] for _ in tokens]
    tops[index] = [("Yes", math.log(0.8)), ("No", math.log(0.15))]
    verifier = FakeLogprobChat(
        responder=lambda messages, kwargs: Scripted(
            "".join(tokens).removesuffix("</output>\n"),
            logprobs,
            tokens=tokens,
            top_logprobs=tops,
            stop_reason=JUDGEMENT_END,
        )
    )
    judgement, usage = await judge_step(
        verifier,
        question="What is 2 + 3?",
        kept_texts=["Add."],
        index=2,
        paragraph="2+3=5.",
        max_tokens=1024,
    )
    (call,) = verifier.calls
    assert call["kwargs"]["stop"] == ["</output>"]
    assert judgement["verdict"] is True
    assert judgement["p_yes"] == pytest.approx(0.8)
    assert judgement["num_tokens"] == len(tokens) == usage.external_tokens
    assert usage.llm_calls == 1
    assert judgement["analysis"].startswith("Let's analyze the Paragraph 2")


CUT_ANALYSIS = "Let's check the paragraph. 1. **Radius**: \\( r = \\sqrt{0^2 + 3^2} = 3 \\)"


def cut_then_forced(verdict: str, p: float) -> FakeLogprobChat:
    """A critic that re-derives the step past its token cap (no verdict) and, continued from
    the forced verdict line, says `verdict` with probability p."""

    def respond(messages: list, kwargs: dict) -> Scripted:
        if len(messages) == 1:
            return Scripted(CUT_ANALYSIS, [-0.2] * 12, stop_reason=None, finish_reason="length")
        other = "No" if verdict == "Yes" else "Yes"
        tokens = [verdict, "}$"]
        tops = [[(verdict, math.log(p)), (other, math.log(1 - p))], []]
        return Scripted("".join(tokens), [math.log(p), -0.01], None, "stop", tokens, tops)

    return FakeLogprobChat(responder=respond)


async def judge(verifier: FakeLogprobChat, **kwargs: object) -> tuple:
    return await judge_step(
        verifier,
        question="Convert (0,3) to polar coordinates.",
        kept_texts=["We need r and theta."],
        index=2,
        paragraph="r = 3.",
        max_tokens=12,
        **kwargs,
    )


@pytest.mark.parametrize(("verdict", "p", "expected"), [("Yes", 0.9, 0.9), ("No", 0.8, 0.2)])
async def test_a_judgement_cut_by_its_cap_is_continued_from_the_verdict_line(
    verdict: str, p: float, expected: float
) -> None:
    verifier = cut_then_forced(verdict, p)
    judgement, usage = await judge(verifier, force_verdict=True)
    first, forced = verifier.calls
    (assistant_turn,) = forced["messages"][1:]
    assert assistant_turn.content == CUT_ANALYSIS + FORCED_VERDICT
    assert forced["kwargs"]["max_tokens"] == FORCED_VERDICT_MAX_TOKENS
    assert forced["kwargs"]["extra_body"].items() >= CONTINUE_FINAL_MESSAGE.items()
    assert "continue_final_message" not in first["kwargs"].get("extra_body", {})
    assert judgement["verdict"] is (verdict == "Yes")
    assert judgement["p_yes"] == pytest.approx(expected)
    assert judgement["text"] == CUT_ANALYSIS + FORCED_VERDICT + verdict + "}$"
    # What a revision is told: the analysis, without the forced verdict line.
    assert judgement["analysis"] == CUT_ANALYSIS
    # Both requests are counted: 12 + 2 generated tokens, two calls.
    assert judgement["num_tokens"] == 14 == usage.external_tokens
    assert usage.llm_calls == 2
    assert usage.external_prompt_tokens == 2 * verifier.prompt_tokens


async def test_without_forcing_a_cut_judgement_has_no_verdict() -> None:
    verifier = cut_then_forced("Yes", 0.9)
    judgement, usage = await judge(verifier)  # the default: the paper's rule
    assert len(verifier.calls) == 1
    assert judgement["verdict"] is None
    assert judgement["p_yes"] == 0.0
    assert judgement["num_tokens"] == 12 == usage.external_tokens
