"""The MUR graph against the real CPU vLLM server, checked against the server's own replies.

Every chat completion is recorded as the server sent it (tests/recorder.py). From those
replies alone the test recomputes, with plain arithmetic as /work/shared/docs/mur-algorithm.md
states it, each step's uncertainty (the mean of -logprob over its generated tokens), the
momentum (M_t = alpha * M_{t-1} + (1 - alpha) * m_t of the kept step) and every gate decision
(mur: t >= 2 and m_t > M_{t-1} - ln gamma; always: every step; never: none), and finds each
kept text in them. None of the graph's own functions or numbers is trusted; the token usage is
checked against the recorded replies and the server's own counter.
"""

from __future__ import annotations

import asyncio
import math
from functools import partial
from typing import Any

import pytest
from server_counters import settled

from mur.graphs import STRATEGIES, Context
from mur.graphs.mur import build_graph
from mur.graphs.solve import solve
from mur.servers import generation_tokens
from recorder import Exchange, Recorder, choice_logprobs, choice_text, recording_model

pytestmark = pytest.mark.integration

QUESTIONS = [
    "A store sells pencils at 3 for $1. How much do 24 pencils cost?",
    "What is the sum of the first 10 positive odd numbers?",
    "If 2x + 3 = 11, what is x?",
]
# Small enough for two CPU cores, large enough for several steps and every mechanism; a gamma
# above 1 makes the mur gate scale some steps and keep others on this model.
TINY = {"max_steps": 4, "max_step_tokens": 32, "judge_max_tokens": 32, "thinking_budget": 32}
GAMMA, ALPHA = 1.2, 0.9
# Every strategy under the two gates that scale; the critic also under never (the gates' own
# unit tests cover the rest on a fake). Every strategy's solutions run in one batch
# (`solved`), each with clients of its own.
GATES = {strategy: ["always", "mur"] for strategy in STRATEGIES}
GATES["critic"].append("never")
GATES["escalate"] = ["mur"]  # always, with a second server: test_escalate_live.py


def mean_surprise(choice: dict[str, Any]) -> float:
    """m: the mean of -logprob over every token the server generated for this choice."""
    logprobs = choice_logprobs(choice)
    assert logprobs, "a step without tokens has no uncertainty"
    return -sum(logprobs) / len(logprobs)


def step_prefix(kept: list[str], index: int) -> str:
    """The assistant text a draft of step `index` continues (the paper's marker format)."""
    return "\n".join([*(f"Step{k}: {text}" for k, text in enumerate(kept, 1)), f"Step{index}:"])


def draft_of(exchanges: list[Exchange], kept: list[str], index: int) -> dict[str, Any]:
    """The reply that drafted step `index`: the question's own turn continued from the kept
    steps, one choice. The last such reply: a foresight rollout of the step before, which
    continues the same text, came back before the draft was asked for."""
    prefix = step_prefix(kept, index)
    drafts = [
        exchange
        for exchange in exchanges
        if [m["role"] for m in exchange.request["messages"]] == ["user", "assistant"]
        and exchange.last_content == prefix
        and exchange.request.get("n", 1) == 1
    ]
    assert drafts, f"no recorded draft of step {index}"
    (choice,) = drafts[-1].choices
    return choice


def check_usage(exchanges: list[Exchange], tokens: int) -> None:
    """One logprob per generated token in every reply, and the tokens the result reports
    are the ones the replies were billed."""
    for exchange in exchanges:
        listed = sum(len(choice_logprobs(choice)) for choice in exchange.choices)
        assert listed == exchange.completion_tokens
    assert tokens == sum(exchange.completion_tokens for exchange in exchanges)


def check_against_replies(
    result: dict[str, Any], backbone: list[Exchange], verifier: list[Exchange], gate: str
) -> None:
    """Uncertainties, kept texts, momentum and every gate decision of one solution, from
    the recorded replies of its question."""
    momentum, kept = 0.0, []
    for index, step in enumerate(result["steps"], start=1):
        draft = draft_of(backbone, kept, index)
        m_draft = mean_surprise(draft)
        expected = {
            "always": True,
            "never": False,
            "mur": index >= 2 and m_draft > momentum - math.log(GAMMA),
        }[gate]
        if gate == "mur" and abs(m_draft - (momentum - math.log(GAMMA))) < 1e-9:
            expected = step["scaled"]  # a tie to rounding: either decision is right
        assert step["scaled"] is expected, f"step {index}: m={m_draft}, M={momentum}"
        # Escalation keeps the external model's step; the momentum reads the draft (its
        # default), so the step's uncertainty is the draft's.
        escalated = step["scaled"] and step["strategy"] == "escalate"
        if step["scaled"]:
            assert step["refine"]["draft"]["text"] == choice_text(draft).strip()
            assert step["refine"]["draft"]["uncertainty"] == pytest.approx(m_draft)
            # The kept step is a reply the backbone (escalate: the external model) sent for
            # this question, word for word.
            sources = [
                choice
                for exchange in (verifier if escalated else backbone)
                for choice in exchange.choices
                if choice_text(choice).strip() == step["text"]
            ]
        else:
            sources = [draft]
            assert step["text"] == choice_text(draft).strip()
        matches = [
            c
            for c in sources
            if len(choice_logprobs(c)) == step["num_tokens"]
            and mean_surprise(draft if escalated else c) == pytest.approx(step["uncertainty"])
        ]
        assert matches, f"step {index}: no recorded reply has its text and uncertainty"
        momentum = ALPHA * momentum + (1 - ALPHA) * mean_surprise(
            draft if escalated else matches[0]
        )
        assert step["momentum_after"] == pytest.approx(momentum)
        kept.append(step["text"])
    usage = result["usage"]
    check_usage(backbone, usage["backbone_tokens"])
    check_usage(verifier, usage["external_tokens"])
    assert usage["llm_calls"] == len(backbone) + len(verifier)


Solved = dict[str, list[tuple[str, str, dict[str, Any], Recorder, Recorder]]]


@pytest.fixture(scope="module")
async def solved(cpu_server) -> Solved:
    """Every strategy's runs (its gates times the questions) solved in one batch, which the
    server decodes together: on a server whose time goes to each decoding step rather than to
    the batch's size, one batch of all of them takes about as long as one strategy's. Every
    token the server generated meanwhile is in a result's usage (no other client, no retry)."""
    runs = [(s, gate, q) for s in STRATEGIES.names for gate in GATES[s] for q in QUESTIONS]
    # One backbone and one verifier client per solution, each recording its replies.
    recorders = [(Recorder(), Recorder()) for _ in runs]
    graphs = [
        build_graph(
            backbone=recording_model(cpu_server.base_url, cpu_server.model, backbone),
            verifier=recording_model(cpu_server.base_url, cpu_server.model, verifier),
        )
        for backbone, verifier in recorders
    ]
    settings = {"gamma": GAMMA, "alpha": ALPHA, "num_candidates": 3, **TINY}
    counter = partial(generation_tokens, cpu_server.base_url)
    before = settled(counter)  # an earlier test's last tokens may still be reaching the counter
    solutions = await asyncio.gather(
        *(
            solve(graph, question, context=Context(strategy=strategy, gate=gate, **settings))
            for graph, (strategy, gate, question) in zip(graphs, runs, strict=True)
        )
    )
    generated = settled(counter) - before
    results = [solution.output for solution in solutions]
    spent = sum(r["usage"]["backbone_tokens"] + r["usage"]["external_tokens"] for r in results)
    # Where tokens went if the counts differ: the replies on the wire, and requests that got
    # none (a retried fault costs tokens no reply reports).
    replied = sum(e.completion_tokens for pair in recorders for r in pair for e in r.exchanges)
    failed = sum(r["usage"]["failed_calls"] for r in results)
    assert spent == generated, f"replies carried {replied} tokens; {failed} requests failed"
    by_strategy: Solved = {strategy: [] for strategy in STRATEGIES.names}
    for (strategy, gate, question), result, (backbone, verifier) in zip(
        runs, results, recorders, strict=True
    ):
        by_strategy[strategy].append((gate, question, result, backbone, verifier))
    return by_strategy


@pytest.mark.parametrize("strategy", STRATEGIES.names)
def test_every_step_and_decision_recomputes_from_the_servers_replies(
    solved: Solved, strategy: str
) -> None:
    for gate, question, result, backbone, verifier in solved[strategy]:
        assert result["steps"], f"{gate}, {question!r}: no step kept"
        check_against_replies(result, backbone.exchanges, verifier.exchanges, gate)
        for step in result["steps"]:
            assert step["strategy"] == (strategy if step["scaled"] else None)
            assert (step["refine"] or {}).get("strategy", strategy) == strategy
        if gate == "never":
            assert result["usage"]["external_tokens"] == 0
        if gate == "mur":
            assert not result["steps"][0]["scaled"]  # never the first step
