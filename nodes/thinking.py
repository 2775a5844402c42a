"""The thinking switch: think about a flagged step (capped), close the block, write the step."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from mur.nodes.draft import MARKER_FORMAT, StepFormat, solution_text
from mur.nodes.llm import Reply, Request, generate
from mur.prompts.mur import (
    THINKING_CLOSE,
    THINKING_END,
    THINKING_PREFIX,
    THINKING_USER_TURN,
)

ThinkingStyle = Literal["prefix", "qwen3"]
THINKING_ON = {"chat_template_kwargs": {"enable_thinking": True}}
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def cap_thinking(text: str, hit_cap: bool) -> str:
    """Thinking cut by the token cap keeps whole sentences only (if it has any)."""
    text = text.strip()
    if not hit_cap:
        return text
    ends = list(_SENTENCE_END.finditer(text))
    return text[: ends[-1].end()] if ends else text


def thinking_conversation(
    question: str,
    system_prompt: str | None,
    kept_texts: Sequence[str],
    index: int,
    fmt: StepFormat = MARKER_FORMAT,
) -> list[BaseMessage]:
    """The user turn for thinking sees the steps so far: the thinking is about step `index`."""
    solution = solution_text(kept_texts) or "(no steps yet)"
    turn = THINKING_USER_TURN.format(
        question=question, instruction=fmt.instruction, solution=solution, index=index
    )
    messages: list[BaseMessage] = [SystemMessage(system_prompt)] if system_prompt else []
    messages.append(HumanMessage(turn))
    return messages


def thinking_request(
    conversation: Sequence[BaseMessage], *, style: ThinkingStyle, budget: int
) -> Request:
    """`prefix`: continue the paper's assistant prefix (any chat template that leaves the
    assistant text alone). `qwen3`: a fresh turn with enable_thinking, since Qwen3's template
    puts a closed empty think block before a continued assistant message whatever
    enable_thinking says (vLLM issue 28089; tests/integration/test_qwen3_template.py)."""
    if style == "prefix":
        return Request(
            messages=[*conversation, AIMessage(THINKING_PREFIX)],
            max_tokens=budget,
            stop=[THINKING_END],
            extra_body=THINKING_ON,
        )
    if style == "qwen3":
        return Request(
            messages=list(conversation),
            max_tokens=budget,
            stop=[THINKING_END],
            continue_final_message=False,
            extra_body=THINKING_ON,
        )
    raise ValueError(f"thinking_style must be 'prefix' or 'qwen3', got {style!r}")


def think_block(thought: str, style: ThinkingStyle) -> str:
    """The closed think block the step is then written after."""
    if style == "prefix":
        return f"{THINKING_PREFIX} {thought}".rstrip() + THINKING_CLOSE
    body = thought.removeprefix("<think>").strip()
    return f"<think>\n{body}" + THINKING_CLOSE


async def think(
    backbone: BaseChatModel,
    conversation: Sequence[BaseMessage],
    *,
    style: ThinkingStyle,
    budget: int,
) -> tuple[str, bool, int, Reply]:
    """Returns the (capped) thought, whether the cap cut it, its tokens and the reply."""
    reply = await generate(backbone, thinking_request(conversation, style=style, budget=budget))
    choice = reply.choices[0]
    hit_cap = choice.finish_reason == "length"
    return cap_thinking(choice.text, hit_cap), hit_cap, choice.num_tokens, reply
