"""Drafting step t: continue the assistant message that holds the kept steps.

The step ends at the next step marker, at end of sequence, or at max_step_tokens. Unlike the
released reference code (which stops on the bare word "Step" and so cuts "step-by-step"), we
stop only on a marker at the start of a line or on the exact next marker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from nodes.llm import Generation, Reply, Request, generate
from prompts.mur import ANSWER_PHRASE, FALLBACK_PREFIX, STEP_INSTRUCTION, STEP_MARKER, USER_TURN

# Normal steps run with thinking off (Qwen3 reads this; other chat templates ignore it).
NON_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
ANSWER_PATTERN = re.compile(re.escape(ANSWER_PHRASE), re.IGNORECASE)


class StepCandidate(TypedDict):
    """A generated step as it travels through graph state (plain data, JSON-friendly)."""

    text: str
    logprobs: list[float]
    num_tokens: int
    ended_by_model: bool
    finish_reason: str | None


# Far beyond any benchmark question; the server's context length is the real limit.
MAX_QUESTION_CHARS = 100_000
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_question(question: object) -> str:
    """A question the models can read, or a ValueError saying what is wrong with it."""
    if not isinstance(question, str):
        raise ValueError(f"the question must be text, got {type(question).__name__}")
    if not question.strip():
        raise ValueError("the question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise ValueError(
            f"the question has {len(question):,} characters; at most {MAX_QUESTION_CHARS:,} "
            "are accepted"
        )
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("the question is not valid UTF-8 text") from exc
    if found := _CONTROL.search(question):
        raise ValueError(
            f"the question contains a control character (code {ord(found.group()):#04x}) at "
            f"position {found.start()}"
        )
    return question


def marker(index: int) -> str:
    return STEP_MARKER.format(index=index)


def step_stops(index: int) -> list[str]:
    """Stop strings for step `index`: a new line opening any step, or the next marker."""
    return ["\nStep", marker(index + 1)]


def solution_text(kept_texts: Sequence[str]) -> str:
    """The kept steps as the model sees them: `Step{k}: text`, joined by newlines."""
    return "\n".join(f"{marker(k)} {text}" for k, text in enumerate(kept_texts, start=1))


def step_prefix(kept_texts: Sequence[str], index: int) -> str:
    """The assistant text to continue for step `index`: the kept steps, then its marker."""
    solution = solution_text(kept_texts)
    return f"{solution}\n{marker(index)}" if solution else marker(index)


def user_turn(question: str) -> str:
    return USER_TURN.format(question=question, instruction=STEP_INSTRUCTION)


def conversation(question: str, system_prompt: str | None) -> list[BaseMessage]:
    """The system prompt (if any) and the user turn every backbone request starts with."""
    messages: list[BaseMessage] = [SystemMessage(system_prompt)] if system_prompt else []
    messages.append(HumanMessage(user_turn(question)))
    return messages


def step_messages(
    question: str, system_prompt: str | None, kept_texts: Sequence[str], index: int
) -> list[BaseMessage]:
    return [*conversation(question, system_prompt), AIMessage(step_prefix(kept_texts, index))]


def to_candidate(choice: Generation) -> StepCandidate:
    return StepCandidate(
        text=choice.text.strip(),
        logprobs=list(choice.logprobs),
        num_tokens=choice.num_tokens,
        ended_by_model=choice.ended_by_model,
        finish_reason=choice.finish_reason,
    )


def contains_answer(text: str) -> bool:
    """A kept step that states the answer ends the solution."""
    return ANSWER_PATTERN.search(text) is not None


async def sample_steps(
    backbone: BaseChatModel,
    messages: Sequence[BaseMessage],
    *,
    index: int,
    n: int,
    max_tokens: int,
    extra_body: dict[str, Any] | None = None,
) -> tuple[list[StepCandidate], Reply]:
    """n samples of step `index` continuing `messages` (the last one the assistant prefix)."""
    reply = await generate(
        backbone,
        Request(
            messages=messages,
            max_tokens=max_tokens,
            stop=step_stops(index),
            n=n,
            extra_body={**NON_THINKING, **(extra_body or {})},
        ),
    )
    return [to_candidate(choice) for choice in reply.choices], reply


async def answer_fallback(
    backbone: BaseChatModel,
    question: str,
    system_prompt: str | None,
    kept_texts: Sequence[str],
    *,
    max_tokens: int,
) -> tuple[str, int, Reply]:
    """After max_steps: one unconstrained continuation that asks for the answer.

    Returns the text (starting with the answer phrase, so extraction finds it), its tokens and
    the reply for accounting.
    """
    prefix = f"{solution_text(kept_texts)}\n{FALLBACK_PREFIX}"
    reply = await generate(
        backbone,
        Request(
            messages=[*conversation(question, system_prompt), AIMessage(prefix)],
            max_tokens=max_tokens,
            extra_body=NON_THINKING,
        ),
    )
    choice = reply.choices[0]
    return f"{FALLBACK_PREFIX}{choice.text}".strip(), choice.num_tokens, reply
