"""The forced-verdict replay: which recorded judgements it replays, and what it reports."""

from __future__ import annotations

import math

import pytest

from fakes import FakeLogprobChat, Scripted
from mur.experiments.verdicts import (
    RecordedJudgement,
    analysis_share,
    plan,
    recorded_judgements,
    replay,
    report,
)
from mur.prompts.mur import FORCED_VERDICT


def critic_record(rounds: list[dict]) -> dict:
    steps = [
        {"index": 1, "text": "We need r.", "refine": None},
        {"index": 2, "text": "r = 3.", "refine": {"strategy": "critic", "rounds": rounds}},
    ]
    return {"problem_id": "p1", "trace": {"steps": steps}}


def judged(text: str, verdict: bool | None, num_tokens: int) -> dict:
    return {"step": "r = 3.", "critique": text, "verdict": verdict, "num_tokens": num_tokens}


def test_every_critic_round_is_read_with_its_prompt_parts() -> None:
    record = critic_record([judged("cut short", None, 256), judged("ok \\boxed{Yes}", True, 9)])
    first, second = recorded_judgements([record], {"p1": "Convert (0,3)."})
    assert first.question == "Convert (0,3)."
    assert first.kept_texts == ("We need r.",) and first.index == 2
    assert first.paragraph == "r = 3." and first.verdict is None
    assert second.verdict is True


def test_a_share_of_the_analysis_is_cut_before_the_verdict_at_a_space() -> None:
    text = "one two three four five six seven eight \\boxed{No}"
    half = analysis_share(text, 0.5)
    assert half is not None and text.startswith(half) and "boxed" not in half
    assert 0 < len(half) <= len("one two three four five six seven eight ") // 2
    assert analysis_share(text, 0.0) == ""
    assert analysis_share("no verdict here", 0.5) is None


def test_plan_takes_cut_judgements_at_the_cap_and_boxed_ones_at_each_share() -> None:
    def j(text: str, verdict: bool | None, tokens: int) -> RecordedJudgement:
        return RecordedJudgement("q", (), 2, "p", text, verdict, tokens)

    cut = j("long analysis", None, 256)
    short_none = j("ended early", None, 40)  # ended by itself: not a cap cut
    bare = j("Yes", True, 1)  # a bare word: no analysis to cut
    boxed = j("the sum is right so \\boxed{Yes}", True, 30)
    jobs = plan([cut, short_none, bare, boxed], cap=256, limit=5, shares=(0.0, 0.5))
    assert [(kind, judgement, text) for kind, judgement, text in jobs] == [
        ("cut", cut, "long analysis"),
        ("agreement@0", boxed, ""),
        ("agreement@0.5", boxed, "the sum"),
    ]
    assert len(plan([cut, cut, cut], cap=256, limit=2, shares=())) == 2


async def test_replay_reads_the_forced_verdict_and_reports_both_tables() -> None:
    def respond(messages: list, kwargs: dict) -> Scripted:
        word = "No" if "wrong" in messages[-1].content else "Yes"
        tops = [[(word, math.log(0.9)), ("No" if word == "Yes" else "Yes", math.log(0.1))], []]
        return Scripted(word + "}$", [math.log(0.9), -0.01], None, "stop", [word, "}$"], tops)

    verifier = FakeLogprobChat(responder=respond)
    cut = RecordedJudgement("q", (), 2, "p", "cut short", None, 256)
    wrong = RecordedJudgement("q", (), 2, "p", "this is wrong ... \\boxed{No}", False, 40)
    jobs = [("cut", cut, "cut short"), ("agreement@0.5", wrong, "this is wrong")]
    results = await replay(verifier, jobs, 2)
    assert [(r.kind, r.recorded, r.forced) for r in results] == [
        ("cut", None, True),
        ("agreement@0.5", False, False),
    ]
    assert results[0].p_yes == pytest.approx(0.9) and results[1].p_yes == pytest.approx(0.1)
    assert all(c["messages"][-1].content.endswith(FORCED_VERDICT) for c in verifier.calls)
    text = report(results, "results/x", cap=256, model="Qwen")
    assert text.startswith("# Forced verdicts of Qwen, replayed on results/x")
    assert "| Yes (kept, no revision) | 1 (100%) |" in text
    assert "| 50% | 1 | 1 (100%) | 0 | 1 (100%) | 0 |" in text
