"""Streamed replies count each token once: vLLM's `continuous_usage_stats` put the count so far
on every chunk, and LangChain adds its chunks' usage up (the message, its meters, its tracers),
so the project's client gives each chunk its share. Against the loopback vLLM-shaped server
(tests/faulty_server.py), whose counter is what it generated."""

from __future__ import annotations

from langchain_core.callbacks import get_usage_metadata_callback
from langchain_core.messages import AIMessageChunk, HumanMessage

from faulty_server import faulty_server
from mur.nodes.llm import ABORTED, Request, generate_watched
from mur.servers import make_chat_model

CONTINUOUS = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


async def test_a_streamed_reply_counts_each_token_once_in_the_message_and_the_meter() -> None:
    with faulty_server(["ok"]) as server:
        model = make_chat_model(server.base_url)
        with get_usage_metadata_callback() as meter:
            chunks = [c async for c in model.astream("What is 2 + 3?", extra_body=CONTINUOUS)]
        generated = server.completion_tokens
    assert generated > 2  # several chunks, each with the count so far
    whole = sum(chunks[1:], chunks[0])
    assert isinstance(whole, AIMessageChunk) and whole.usage_metadata is not None
    assert whole.usage_metadata["output_tokens"] == generated
    [counted] = meter.usage_metadata.values()
    assert counted["output_tokens"] == generated
    assert counted["input_tokens"] == whole.usage_metadata["input_tokens"] > 0


async def test_a_watched_reply_stopped_early_counts_the_tokens_read() -> None:
    seen: list[int] = []

    def stop_at_third(tops: object) -> bool:
        seen.append(1)
        return len(seen) == 3

    with faulty_server(["ok"]) as server:
        model = make_chat_model(server.base_url, top_logprobs=2)
        request = Request([HumanMessage("What is 2 + 3?")], max_tokens=64, top_logprobs=2)
        reply = await generate_watched(model, request, stop_at_third)
    [choice] = reply.choices
    assert choice.finish_reason == ABORTED
    assert reply.completion_tokens == 3  # the server's count when the third token was read
    assert reply.prompt_tokens > 0
