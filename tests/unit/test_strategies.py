"""Each refine strategy inside the graph, against scripted fakes."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from fakes import FakeLogprobChat, Scripted
from mur.graphs.mur import build_graph
from mur.graphs.refine import STRATEGIES, RefineRecord, summarise
from mur.graphs.refine.critic import CriticRecord
from mur.graphs.state import Context

YES_P = {"right": 0.9, "wrong": 0.2}


def _index(messages: list[BaseMessage]) -> int:
    found = re.findall(r"Step(\d+):$", str(messages[-1].content))
    return int(found[-1]) if found else 0


def _judge(messages: list[BaseMessage]) -> Scripted:
    paragraph = re.search(r"<paragraph_\d+>\n(.*)\n</paragraph", str(messages[0].content), re.S)
    p = YES_P["right" if "right" in paragraph.group(1) else "wrong"]
    return Scripted(
        "\\boxed{Yes}",
        [-0.1, math.log(p), -0.1],
        tokens=["\\boxed{", "Yes", "}"],
        top_logprobs=[[], [("Yes", math.log(p))], []],
        stop_reason=None,
    )


def backbone_script(kwargs_seen: list[dict[str, Any]]):
    """Step 1 gives candidates 'wrong A', 'right B', ...; step 2 states the answer."""

    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Any:
        kwargs_seen.append(kwargs)
        if isinstance(messages[0], HumanMessage) and "You are a teacher" in messages[0].content:
            return _judge(messages)
        last = str(messages[-1].content)
        if last.endswith("Okay, so I need to") or "Think carefully" in str(messages[-1].content):
            return Scripted(
                " add the numbers. Then check. And then",
                [-0.2] * 9,
                finish_reason="length",
                stop_reason=None,
            )
        if last.endswith("the answer is"):
            return Scripted(" 3.", [-0.2, -0.2], stop_reason=None)
        index = _index(messages)
        if index == 1:
            n = kwargs.get("n", 1)
            texts = ["wrong A", "right B", "right B", "wrong C"][:n]
            return [Scripted(f" {t}", [-0.5 - i * 0.1] * 3) for i, t in enumerate(texts)]
        if index == 2:
            return Scripted(" Rollout says the answer is 3.", [-0.3] * 5, stop_reason=None)
        raise AssertionError(f"unexpected request for step {index}")

    return respond


async def run(strategy: str, **settings: Any) -> tuple[dict, FakeLogprobChat, list]:
    seen: list[dict[str, Any]] = []
    model = FakeLogprobChat(responder=backbone_script(seen), supports_n_choices=True)
    graph = build_graph(backbone=model)
    result = await graph.ainvoke(
        {"question": "1 + 2?"},
        context=Context(strategy=strategy, gate="always", max_steps=2, **settings),
    )
    return result, model, seen


async def test_best_of_n_picks_highest_p_yes_in_one_request() -> None:
    result, model, seen = await run("best_of_n")
    first = result["steps"][0]
    refine = first["refine"]
    assert [round(c["score"], 6) for c in refine["candidates"]] == [0.2, 0.9, 0.9, 0.2]
    assert refine["chosen"] == 1  # ties go to the first best
    assert first["text"] == "right B"
    # One request with n=4 for the candidates (plus the discarded draft before it).
    assert [k.get("n") for k in seen[:2]] == [None, 4]
    usage = result["usage"]
    # Draft 3 + candidates 12 for step 1; step 2: draft 5 + 4 candidates of 5 = 25 -> 40.
    assert usage["backbone_tokens"] == 3 + 12 + 5 + 20
    assert usage["external_tokens"] == 8 * 3
    assert usage["llm_calls"] == len(model.calls)


async def test_best_of_n_falls_back_to_concurrent_requests() -> None:
    seen: list[dict[str, Any]] = []
    model = FakeLogprobChat(responder=backbone_script(seen), supports_n_choices=False)
    result = await build_graph(backbone=model).ainvoke(
        {"question": "1 + 2?"}, context=Context(strategy="best_of_n", gate="always", max_steps=1)
    )
    assert len(result["steps"][0]["refine"]["candidates"]) == 4
    assert all(k.get("n") is None for k in seen)


async def test_foresight_rolls_out_each_candidate_and_records_weights() -> None:
    result, _, seen = await run("foresight", foresight_selection="argmax")
    refine = result["steps"][0]["refine"]
    assert refine["strategy"] == "foresight" and refine["selection"] == "argmax"
    candidates = refine["candidates"]
    assert len(candidates) == 4
    assert all(c["rollout"] == "Rollout says the answer is 3." for c in candidates)
    assert all(c["score"] == pytest.approx(-0.3) for c in candidates)
    # Equal rollout scores: the cluster sizes decide; weights sum to 1.
    assert sum(c["weight"] for c in candidates) == pytest.approx(1.0)
    best = max(c["weight"] for c in candidates)
    assert candidates[refine["chosen"]]["weight"] == best
    # Rollouts stop where the step after the next one would begin.
    rollout_stops = [k["stop"] for k in seen if k.get("stop") and "\nStep3:" in k["stop"]]
    assert len(rollout_stops) == 4


async def test_foresight_sampling_is_seeded() -> None:
    first, _, _ = await run("foresight", seed=5)
    again, _, _ = await run("foresight", seed=5)
    assert first["steps"][0]["refine"]["chosen"] == again["steps"][0]["refine"]["chosen"]


async def test_thinking_caps_then_writes_the_step_after_the_block() -> None:
    result, model, seen = await run("thinking", thinking_budget=9)
    refine = result["steps"][0]["refine"]
    assert refine["thinking"] == "add the numbers. Then check."
    assert refine["capped"] is True
    assert refine["thinking_tokens"] == 9
    step_request = next(
        c
        for c in model.calls
        if isinstance(c["messages"][-1], AIMessage) and "</think>" in c["messages"][-1].content
    )
    assert step_request["messages"][-1].content.endswith(
        "add the numbers. Then check.\n</think>\n\nStep1:"
    )
    # The step itself is written with thinking off (the block is already in the message).
    assert step_request["kwargs"]["extra_body"]["chat_template_kwargs"] == {
        "enable_thinking": False
    }
    think_request = next(k for k in seen if k.get("stop") == ["</think>"])
    assert think_request["max_tokens"] == 9
    # Thinking tokens are backbone tokens.
    assert result["usage"]["backbone_tokens"] >= 9 * 2


async def test_thinking_qwen3_style_asks_a_fresh_turn() -> None:
    _, model, _ = await run("thinking", thinking_style="qwen3")
    think_call = next(c for c in model.calls if c["kwargs"].get("stop") == ["</think>"])
    assert isinstance(think_call["messages"][-1], HumanMessage)
    assert "continue_final_message" not in think_call["kwargs"]["extra_body"]


async def test_reuse_draft_keeps_the_draft_as_candidate_zero() -> None:
    result, _, seen = await run("best_of_n", reuse_draft=True)
    refine = result["steps"][0]["refine"]
    assert refine["reused_draft"] is True
    assert refine["candidates"][0]["text"] == refine["draft"]["text"] == "wrong A"
    assert [k.get("n") for k in seen[:2]] == [None, 3]
    # The draft's tokens are not spent twice: 3 + 3 new candidates of 3 tokens for step 1.
    assert result["usage"]["backbone_tokens"] == 3 + 9 + 5 + 15


# The refine records as records.jsonl and the JSON output hold them: keys and their order.
RECORD_KEYS = {
    "critic": ["strategy", "draft", "rounds", "revised"],
    "best_of_n": ["strategy", "draft", "candidates", "chosen", "reused_draft"],
    "foresight": ["strategy", "draft", "candidates", "chosen", "selection", "reused_draft"],
    "thinking": ["strategy", "draft", "thinking", "thinking_tokens", "capped"],
    "escalate": ["strategy", "draft", "rewrite", "momentum_reads"],
}
SUMMARY_KEYS = ["text", "uncertainty", "num_tokens", "confidence", "first_token_entropy"]
CANDIDATE_KEYS = {
    "best_of_n": [*SUMMARY_KEYS, "score", "verdict", "judgement"],
    "foresight": [*SUMMARY_KEYS, "rollout", "rollout_tokens", "score", "cluster", "weight"],
}
SUMMARIES = {
    "critic": "judged correct",
    "best_of_n": "chose 2 of 4",
    "foresight": "chose 1 of 4",
    "thinking": "thought 9 tokens",
    "escalate": "written by the external model, 3 tokens",
}


@pytest.mark.parametrize("strategy", STRATEGIES.names)
async def test_refine_records_keep_their_shape_and_summarise_themselves(strategy: str) -> None:
    result, _, _ = await run(strategy, foresight_selection="argmax")
    refine = result["steps"][0]["refine"]
    assert list(refine) == RECORD_KEYS[strategy]
    assert list(refine["draft"]) == SUMMARY_KEYS
    for candidate in refine.get("candidates", []):
        assert list(candidate) == CANDIDATE_KEYS[strategy]
    assert summarise(refine) == SUMMARIES[strategy]
    assert summarise(None) == ""
    json.dumps(result)  # plain data all the way down


@pytest.mark.parametrize("strategy", STRATEGIES.names)
async def test_uses_verifier_says_whether_the_strategy_asks_the_verifier(strategy: str) -> None:
    """The registry's `uses_verifier` decides whose throughput bounds a benchmark's questions
    in flight (evals.evaluation): it must match the calls the strategy makes."""
    seen: list[dict[str, Any]] = []
    backbone = FakeLogprobChat(responder=backbone_script(seen), supports_n_choices=True)
    verifier = FakeLogprobChat(responder=backbone_script(seen), supports_n_choices=True)
    graph = build_graph(backbone=backbone, verifier=verifier)
    await graph.ainvoke(
        {"question": "1 + 2?"},
        context=Context(strategy=strategy, gate="always", max_steps=2),
    )
    assert backbone.calls
    assert bool(verifier.calls) == STRATEGIES[strategy].uses_verifier


def test_critic_rounds_carry_a_revision_only_when_revised() -> None:
    draft = {"text": "d", "uncertainty": 0.5, "num_tokens": 3, "confidence": 0.6,
             "first_token_entropy": None}  # fmt: skip
    rounds = [
        {"step": "d", "critique": "no", "verdict": False, "num_tokens": 2, "revised": True},
        {"step": "e", "critique": "yes", "verdict": True, "num_tokens": 2, "revised": False},
    ]
    rounds[0]["revision"] = "e"
    record = {"strategy": "critic", "draft": draft, "rounds": rounds, "revised": True}
    assert CriticRecord.model_validate(record).as_dict() == record
    assert summarise(record) == "revised"


def test_the_registry_is_the_list_of_strategies() -> None:
    assert STRATEGIES.names == ("critic", "best_of_n", "foresight", "thinking", "escalate")
    for entry in STRATEGIES.values():
        assert entry.description and issubclass(entry.record, RefineRecord)
