"""The lean reply reader (VLLMChatOpenAI.raw_replies) reads what the stock path reads.

The project's chat model reads each reply's JSON straight into dicts, without the SDK's typed
parse; the stock ChatOpenAI path (`raw_replies=False`) is the reference. Both read the same
bytes here, shaped exactly as vLLM 0.32 writes them (testing/vllm_replies.py, checked against
vLLM's own response class below), so any difference is the reader's: the text, the token
logprobs and their top entries, why a choice stopped, the reasoning a parser filed apart, and
the usage must all come out equal.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from faulty_server import STEP_TOKENS, chat_reply
from mur.nodes.llm import Request
from mur.servers.clients.chat_models import make_chat_model
from mur.testing.fake_vllm import Choice, reply_body, step_choice, verdict_choice
from mur.testing.vllm_replies import dumps
from recorder import read_both, replaying_client

BASE_URL = "http://vllm.test/v1"


def with_reasoning(body: bytes, reasoning: str) -> bytes:
    """The reply as a server with `--reasoning-parser` writes it: thinking in `reasoning`."""
    data = json.loads(body)
    for choice in data["choices"]:
        choice["message"]["reasoning"] = reasoning
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


STEP = Request(
    messages=[HumanMessage("What is 6 x 7?"), AIMessage("Step1:")],
    max_tokens=256,
    stop=["\nStep", "Step2:"],
)


@pytest.mark.parametrize("top", [0, 1, 20])
@pytest.mark.parametrize("n", [1, 2])
def test_a_step_reads_the_same_at_every_top_logprobs(top: int, n: int) -> None:
    body = reply_body([step_choice(1, 8, revised=False)] * n, top, prompt_tokens=37)
    request = replace(STEP, n=n, top_logprobs=top or None)
    lean, stock, asked = read_both(body, request)
    assert lean == stock
    assert asked[0] == asked[1]  # the same request went out
    assert len(lean.choices) == n
    assert lean.choices[0].stop_reason == "\nStep" and lean.choices[0].stop_reason_known
    assert len(lean.choices[0].top_logprobs[0]) == top
    assert (lean.completion_tokens, lean.prompt_tokens) == (72 * n, 37)


def test_a_verdict_and_the_last_step_read_the_same() -> None:
    for choice in (verdict_choice(correct=True), step_choice(8, 8, revised=True)):
        lean, stock, _ = read_both(reply_body([choice], 5, prompt_tokens=12), STEP)
        assert lean == stock
        assert lean.choices[0].ended_by_model  # EOS: stop_reason None


def test_a_reasoning_parsers_reply_reads_the_same() -> None:
    body = with_reasoning(reply_body([step_choice(2, 8, revised=False)], 1, 50), "Hmm, so x.")
    lean, stock, _ = read_both(body, STEP)
    assert lean == stock
    assert lean.choices[0].reasoning == "Hmm, so x."
    assert lean.choices[0].text.startswith("Hmm, so x. we find")


def test_the_langchain_message_is_the_stock_one() -> None:
    """What an embedder sees of a reply: content, metadata, usage, generation info."""
    body = with_reasoning(reply_body([step_choice(3, 8, False)], 20, 9), "thinking")
    results = []
    for raw in (True, False):
        client = replaying_client(body, [])
        model = make_chat_model(BASE_URL, "fake/vllm", raw_replies=raw, http_async_client=client)
        results.append(asyncio.run(model.agenerate([[HumanMessage("q")]])).generations[0][0])
    lean, stock = results
    # The SDK's typed model adds `refusal: null` to the logprobs, a field vLLM never sent.
    assert stock.generation_info["logprobs"].pop("refusal") is None
    assert lean.message.content == stock.message.content
    assert lean.message.additional_kwargs == stock.message.additional_kwargs
    assert lean.message.usage_metadata == stock.message.usage_metadata
    assert lean.generation_info == stock.generation_info
    assert lean.message.response_metadata == stock.message.response_metadata


def test_the_fake_replies_are_vllms_own_bytes() -> None:
    """testing/vllm_replies.py writes what vLLM 0.32's response class dumps, byte for byte,
    for the instant fake (testing/fake_vllm.py) and the fault injector (tests/faulty_server.py)."""
    protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
    choices: list[Choice] = [step_choice(4, 8, False), step_choice(4, 8, False)]
    step = chat_reply(STEP_TOKENS, stop_reason="\nStep", end_token="\nStep", top=3)
    cut = chat_reply(with_logprobs=False, finish_reason="length", end_token=None)
    fakes = (reply_body(choices, 20, 61), reply_body([verdict_choice(False)], 5, 7))
    for body in (*fakes, dumps(chat_reply()), dumps(step), dumps(cut)):
        dumped = protocol.ChatCompletionResponse.model_validate(json.loads(body)).model_dump()
        assert json.dumps(dumped, ensure_ascii=False, separators=(",", ":")).encode() == body
