"""Escalation (graphs/refine/escalate.py): the external model writes a flagged step, against
scripted fakes; the first_token gate (GlimpRouter) and the backbone's score of a step it did
not write (nodes/rescore.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from fakes import FakeLogprobChat, Scripted
from mur.graphs.mur import build_graph
from mur.graphs.refine import summarise
from mur.graphs.state import FIRST_TOKEN_TOP_LOGPROBS, Context, ContextError, context_for
from mur.nodes.gates import GateHistory, GateParams, decide, replay_decisions
from mur.nodes.llm import MissingLogprobsError
from mur.nodes.rescore import PROMPT_LOGPROBS, text_logprobs
from mur.nodes.uncertainty import step_uncertainty
from mur.servers.clients.chat_models import RequestTimeout, make_chat_model

DRAFT_1 = Scripted(" guess 5", [-2.0, -2.0, -2.0])  # the backbone's uncertain step 1
LARGE_1 = Scripted(" 1 + 2 = 3", [-0.1] * 6)  # the external model's step 1
ANSWER = Scripted(" So the answer is 3.", [-0.2] * 5, stop_reason=None)
# The backbone's logprobs of the external model's step, as vLLM's prompt_logprobs give them:
# the prompt's tokens up to and including the step's (only the last 4 spell " 1 + 2 = 3").
RESCORED = [("Step", -0.5), ("1", -0.5), (":", -0.4), (" 1", -0.3), (" +", -0.2), (" 2", -0.2),
            (" = 3", -0.1)]  # fmt: skip


def backbone(calls: list[dict[str, Any]]) -> FakeLogprobChat:
    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        calls.append(kwargs)
        prefix = str(messages[-1].content)
        if (kwargs.get("extra_body") or {}).get("prompt_logprobs") == 0:
            return Scripted("x", [-1.0], prompt_logprobs=RESCORED)
        return DRAFT_1 if prefix.endswith("Step1:") else ANSWER

    return FakeLogprobChat(responder=respond)


def external(prefixes: list[str]) -> FakeLogprobChat:
    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        assert isinstance(messages[-1], AIMessage)  # it continues the backbone's own message
        prefixes.append(str(messages[-1].content))
        return LARGE_1

    return FakeLogprobChat(responder=respond)


async def solve(**settings: Any) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    calls: list[dict[str, Any]] = []
    prefixes: list[str] = []
    graph = build_graph(backbone=backbone(calls), verifier=external(prefixes))
    context = Context(strategy="escalate", gate="smart", tau=0.5, max_steps=3, **settings)
    result = await graph.ainvoke({"question": "1 + 2?"}, context=context)
    return result, calls, prefixes


async def test_the_external_model_writes_the_flagged_step_and_it_is_kept() -> None:
    result, calls, prefixes = await solve()
    first, second = result["steps"]
    assert prefixes == ["Step1:"]  # asked once, from the same prefix as the draft
    assert first["text"] == "1 + 2 = 3" and first["scaled"] and first["strategy"] == "escalate"
    assert not second["scaled"] and result["answer"] == "3"
    # The backbone continued from the external model's step.
    assert first["num_tokens"] == 6
    # The momentum read the draft's uncertainty (the default), not the external model's.
    assert first["uncertainty"] == pytest.approx(2.0)
    assert first["momentum_after"] == pytest.approx(0.1 * 2.0)
    refine = first["refine"]
    assert refine["momentum_reads"] == "draft"
    assert refine["draft"]["text"] == "guess 5"
    assert refine["rewrite"]["uncertainty"] == pytest.approx(0.1)
    assert summarise(refine) == "written by the external model, 6 tokens"
    # Every token counted once: both drafts the backbone's, the rewrite the external model's.
    usage = result["usage"]
    assert (usage["backbone_tokens"], usage["external_tokens"]) == (3 + 5, 6)
    assert usage["llm_calls"] == 3 and len(calls) == 2


async def test_rescored_reads_the_backbones_uncertainty_of_the_kept_text() -> None:
    result, calls, _ = await solve(escalate_momentum="rescored")
    first = result["steps"][0]
    assert first["refine"]["momentum_reads"] == "rescored"
    assert first["uncertainty"] == pytest.approx((0.3 + 0.2 + 0.2 + 0.1) / 4)
    scoring = [c for c in calls if (c.get("extra_body") or {}).get("prompt_logprobs") == 0]
    assert len(scoring) == 1 and scoring[0]["max_tokens"] == 1
    # The scoring request generated one token, counted as the backbone's.
    assert result["usage"]["backbone_tokens"] == 3 + 1 + 5
    assert result["usage"]["external_tokens"] == 6


async def test_rescoring_without_prompt_logprobs_says_what_to_do() -> None:
    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        return DRAFT_1

    graph = build_graph(backbone=FakeLogprobChat(responder=respond), verifier=external([]))
    context = Context(strategy="escalate", gate="always", max_steps=1, escalate_momentum="rescored")
    with pytest.raises(MissingLogprobsError, match="escalate_momentum draft"):
        await graph.ainvoke({"question": "1 + 2?"}, context=context)


def test_text_logprobs_takes_the_tokens_that_spell_the_text() -> None:
    assert text_logprobs(RESCORED, "1 + 2 = 3") == [-0.3, -0.2, -0.2, -0.1]
    assert text_logprobs([("a", -1.0), ("bc", -2.0)], "abc") == [-1.0, -2.0]
    with pytest.raises(ValueError, match="fewer than the step's 9"):
        text_logprobs([(" = 3", -0.1)], "1 + 2 = 3")


def gate_call(entropy: float | None, threshold: float = 1.0) -> bool:
    return decide(
        "first_token",
        step=1,
        uncertainty=0.1,
        confidence=0.9,
        history=GateHistory(),
        params=GateParams(first_token_threshold=threshold),
        first_token_entropy=entropy,
    ).scale


def test_the_first_token_gate_reads_the_first_tokens_entropy() -> None:
    assert gate_call(1.5) and not gate_call(0.5) and not gate_call(1.5, threshold=2.0)
    with pytest.raises(ValueError, match="set top_logprobs"):
        gate_call(None)
    decisions = replay_decisions(
        "first_token", [0.1, 0.2, 0.3], first_token_entropies=[0.2, 1.4, 0.9]
    )
    assert decisions == [False, True, False]
    with pytest.raises(ValueError, match="first_token_entropies, one per step"):
        replay_decisions("first_token", [0.1])


def test_the_first_token_gate_needs_top_logprobs() -> None:
    with pytest.raises(ContextError, match="gate first_token reads the first token's entropy"):
        Context(gate="first_token")
    assert Context(gate="first_token", top_logprobs=5).first_token_threshold == 1.0
    # A label (the CLI's, the endpoint's model names) asks for them when no number is given.
    assert context_for("first_token").top_logprobs == FIRST_TOKEN_TOP_LOGPROBS
    assert context_for("first_token", {"top_logprobs": 5}).top_logprobs == 5


async def test_steps_record_the_drafts_first_token_entropy_for_replays() -> None:
    flat = [("a", math.log(0.5)), ("b", math.log(0.5))]  # entropy ln 2 at the first token
    sharp = [("a", math.log(0.99)), ("b", math.log(0.01))]

    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        if str(messages[-1].content).endswith("Step1:"):
            return Scripted(" ab", [-0.7, -0.7], top_logprobs=[flat, sharp])
        return Scripted(" So the answer is 3.", [-0.01] * 2, top_logprobs=[sharp, sharp],
                        stop_reason=None)  # fmt: skip

    graph = build_graph(backbone=FakeLogprobChat(responder=respond), verifier=external([]))
    context = Context(
        strategy="escalate",
        gate="first_token",
        first_token_threshold=0.5,
        top_logprobs=2,
        max_steps=3,
    )
    result = await graph.ainvoke({"question": "1 + 2?"}, context=context)
    first, second = result["steps"]
    assert first["scaled"] and not second["scaled"]
    assert first["first_token_entropy"] == pytest.approx(math.log(2), abs=1e-3)
    assert first["refine"]["draft"]["first_token_entropy"] == first["first_token_entropy"]
    assert second["first_token_entropy"] < 0.1
    assert step_uncertainty([-0.7, -0.7]) == pytest.approx(first["uncertainty"])


def test_a_scoring_requests_timeout_allows_for_its_prompt() -> None:
    """The backbone computes a scored prompt afresh (no prefix cache) for one generated token:
    its timeout is sized for the prompt too, else a busy CPU server times it out."""
    model = make_chat_model("http://127.0.0.1:9/v1", "m", timeouts=RequestTimeout(60, 5))
    text = HumanMessage("x" * 4000)
    scoring = model._get_request_payload([text], max_tokens=1, extra_body=PROMPT_LOGPROBS)
    plain = model._get_request_payload([text], max_tokens=1)
    assert scoring["timeout"].read == 60 + 5 * (1 + 1000)
    assert plain["timeout"].read == 60 + 5 * 1
