"""Text a server's reasoning parser files apart (vLLM `reasoning`) is still read as the reply.

With `--reasoning-parser qwen3` and thinking on, vLLM returns the thinking in `reasoning`
(`reasoning_content` before 0.11) and leaves `content` empty; stock ChatOpenAI drops that
field. The live proof is tests/integration/test_qwen3_template.py; these pin each link.
"""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from fakes import FakeLogprobChat, Scripted
from mur.nodes.llm import Request, generate
from mur.nodes.thinking import think
from mur.servers.clients.chat_models import make_chat_model


def _response(message: dict) -> dict:
    return {
        "id": "x",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": "length",
                "stop_reason": None,
                "logprobs": {"content": [{"token": "t", "logprob": -0.5}]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def test_the_client_keeps_vllms_reasoning_field_under_both_names() -> None:
    llm = make_chat_model("http://h:1/v1", "m")
    for field in ("reasoning", "reasoning_content"):
        result = llm._create_chat_result(_response({"content": None, field: "Let me see."}))
        message = result.generations[0].message
        assert message.additional_kwargs["reasoning_content"] == "Let me see."
        assert message.content == ""
    plain = llm._create_chat_result(_response({"content": "Step text"}))
    assert "reasoning_content" not in plain.generations[0].message.additional_kwargs


async def test_a_reply_filed_as_reasoning_reads_as_its_text() -> None:
    model = FakeLogprobChat(
        responder=lambda m, k: Scripted("", [-0.2] * 3, reasoning="Let me see.", stop_reason=None)
    )
    reply = await generate(model, Request(messages=[HumanMessage("q")], max_tokens=3))
    (choice,) = reply.choices
    assert choice.text == "Let me see." and choice.reasoning == "Let me see."
    assert choice.num_tokens == 3


async def test_qwen3_style_thought_is_read_from_the_reasoning_field() -> None:
    model = FakeLogprobChat(
        responder=lambda m, k: Scripted(
            "",
            [-0.2] * 6,
            reasoning="\nFirst add. Then carry the",
            finish_reason="length",
            stop_reason=None,
        )
    )
    thought, capped, tokens, _ = await think(model, [HumanMessage("q")], style="qwen3", budget=6)
    assert (thought, capped, tokens) == ("First add.", True, 6)
