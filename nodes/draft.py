"""Drafting step t: continue the assistant message that holds the kept steps.

How steps are written and where one ends is a `StepFormat`:
- `marker` (the paper): `Step{k}: text` lines; a step ends at the next step marker. Unlike the
  released reference code (which stops on the bare word "Step" and so cuts "step-by-step"), we
  stop only on a marker at the start of a line or on the exact next marker.
- `paragraph` (PRM data, search-and-learn): steps are paragraphs; a step ends at a blank line.
  For models that do not write `StepN:` markers.
Either way a step also ends at end of sequence or at max_step_tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from mur.nodes.answer import states_answer
from mur.nodes.confidence import token_confidence, token_entropy
from mur.nodes.llm import Generation, Reply, Request, TokenWatch, generate, generate_watched
from mur.prompts.mur import (
    FALLBACK_PREFIX,
    PARAGRAPH_INSTRUCTION,
    STEP_INSTRUCTION,
    STEP_MARKER,
    USER_TURN,
)

# Normal steps run with thinking off (Qwen3 reads this; other chat templates ignore it).
NON_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
StepFormatName = Literal["marker", "paragraph"]


class StepCandidate(TypedDict):
    """A generated step as it travels through graph state (plain data, JSON-friendly)."""

    text: str
    logprobs: list[float]
    num_tokens: int
    ended_by_model: bool
    finish_reason: str | None
    confidences: NotRequired[list[float]]
    """DeepConf's confidence of each token, when the request asked for top logprobs."""
    entropy_spikes: NotRequired[list[EntropySpike]]
    """EAGer's branch points inside the step, when the run branches by token entropy."""
    first_token_entropy: NotRequired[float]
    """The top-k entropy of the step's first token (nats), when the request asked for top
    logprobs: what GlimpRouter routes a step on."""


class EntropySpike(TypedDict):
    """A generated token whose top-k entropy exceeded the run's threshold: its index among
    the step's generated tokens, the characters of the step's text before it, its entropy."""

    token: int
    chars: int
    entropy: float


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


@dataclass(frozen=True)
class StepFormat:
    """How the backbone writes its steps, and where one step ends."""

    name: StepFormatName
    instruction: str
    """The sentence after the question that asks for this format."""

    @property
    def separator(self) -> str:
        """What follows a step before the next one."""
        return PARAGRAPH_SEPARATOR if self.name == "paragraph" else "\n"

    def line(self, index: int, text: str) -> str:
        """Step `index` as it is written out, its separator included."""
        if self.name == "paragraph":
            return f"{text}{self.separator}"
        return f"{marker(index)} {text}{self.separator}"

    def solution(self, kept_texts: Sequence[str]) -> str:
        """The kept steps as the model sees them in its own assistant message."""
        lines = "".join(self.line(k, text) for k, text in enumerate(kept_texts, start=1))
        return lines.removesuffix(self.separator)

    def prefix(self, kept_texts: Sequence[str], index: int, partial: str = "") -> str:
        """The assistant text to continue for step `index`; `partial`: the start of the step
        already written (a branch that starts inside a parent's step)."""
        solution = self.solution(kept_texts)
        if self.name == "paragraph":
            return f"{solution}{PARAGRAPH_SEPARATOR}{partial}" if solution else partial
        start = f"{solution}\n{marker(index)}" if solution else marker(index)
        return f"{start} {partial}" if partial else start

    def stops(self, index: int) -> list[str]:
        """Stop strings that end step `index`."""
        if self.name == "paragraph":
            return [PARAGRAPH_SEPARATOR]
        return ["\nStep", marker(index + 1)]

    def rollout_stops(self, index: int, steps_ahead: int) -> list[str] | None:
        """Stops of a rollout of `steps_ahead` steps after step `index` (0: the whole
        solution; None: no stop string can say it, the token cap ends the rollout)."""
        if steps_ahead == 0:
            return None
        if self.name == "paragraph":
            return [PARAGRAPH_SEPARATOR] if steps_ahead == 1 else None
        nxt = index + steps_ahead + 1
        return [f"\n{marker(nxt)}", marker(nxt)]


PARAGRAPH_SEPARATOR = "\n\n"
STEP_FORMATS: dict[str, StepFormat] = {
    "marker": StepFormat("marker", STEP_INSTRUCTION),
    "paragraph": StepFormat("paragraph", PARAGRAPH_INSTRUCTION),
}
MARKER_FORMAT = STEP_FORMATS["marker"]


def solution_text(kept_texts: Sequence[str]) -> str:
    """The kept steps as the verifier, critic and thinking prompts show them: numbered
    `Step{k}: text` lines, whatever format the backbone writes in."""
    return MARKER_FORMAT.solution(kept_texts)


def user_turn(question: str, fmt: StepFormat = MARKER_FORMAT) -> str:
    return USER_TURN.format(question=question, instruction=fmt.instruction)


def conversation(
    question: str, system_prompt: str | None, fmt: StepFormat = MARKER_FORMAT
) -> list[BaseMessage]:
    """The system prompt (if any) and the user turn every backbone request starts with."""
    messages: list[BaseMessage] = [SystemMessage(system_prompt)] if system_prompt else []
    messages.append(HumanMessage(user_turn(question, fmt)))
    return messages


def step_messages(
    question: str,
    system_prompt: str | None,
    kept_texts: Sequence[str],
    index: int,
    fmt: StepFormat = MARKER_FORMAT,
    partial: str = "",
) -> list[BaseMessage]:
    return [
        *conversation(question, system_prompt, fmt),
        AIMessage(fmt.prefix(kept_texts, index, partial)),
    ]


def to_candidate(choice: Generation) -> StepCandidate:
    candidate = StepCandidate(
        text=choice.text.strip(),
        logprobs=list(choice.logprobs),
        num_tokens=choice.num_tokens,
        ended_by_model=choice.ended_by_model,
        finish_reason=choice.finish_reason,
    )
    if any(choice.top_logprobs):
        candidate["confidences"] = token_confidences(choice)
        if choice.top_logprobs[0]:
            candidate["first_token_entropy"] = token_entropy(choice.top_logprobs[0])
    return candidate


def token_confidences(choice: Generation) -> list[float]:
    """Each generated token's confidence from its top logprobs (the request asked for them)."""
    return [token_confidence(tops) for tops in choice.top_logprobs]


def entropy_spikes(choice: Generation, threshold: float, before: str = "") -> list[EntropySpike]:
    """The tokens of `choice` whose top-k entropy exceeds `threshold`, each with the
    characters of the step's text before it: the step's text is `before` (text kept from a
    parent) and the choice's, stripped as candidates are. Tokens of a stop string past the
    text have no place in it; a reply whose tokens do not spell its text (byte tokens) has
    no spikes."""
    raw = before + choice.text
    spelled = before + "".join(choice.tokens)
    if not spelled.startswith(raw):
        return []
    lead = len(raw) - len(raw.lstrip())
    text_length = len(raw.strip())
    spikes: list[EntropySpike] = []
    start = len(before)
    for index, (token, tops) in enumerate(zip(choice.tokens, choice.top_logprobs, strict=True)):
        chars = start - lead
        if tops and 0 <= chars < text_length:
            entropy = token_entropy(tops)
            if entropy > threshold:
                spikes.append(EntropySpike(token=index, chars=chars, entropy=entropy))
        start += len(token)
    return spikes


def contains_answer(text: str) -> bool:
    """A kept step that states the answer ends the solution (an echo of the instruction's
    'the answer is' does not)."""
    return states_answer(text)


async def sample_steps(
    backbone: BaseChatModel,
    messages: Sequence[BaseMessage],
    *,
    index: int,
    n: int,
    max_tokens: int,
    fmt: StepFormat = MARKER_FORMAT,
    extra_body: dict[str, Any] | None = None,
    top_logprobs: int = 0,
    role: Literal["backbone", "external"] = "backbone",
) -> tuple[list[StepCandidate], Reply]:
    """n samples of step `index` continuing `messages` (the last one the assistant prefix);
    with `top_logprobs` k > 0 each candidate carries its tokens' confidences and its first
    token's entropy. `role`: whose tokens these are (the external model's, in a cascade)."""
    request = step_request(messages, index, max_tokens, fmt, top_logprobs, n, extra_body, role)
    reply = await generate(backbone, request)
    return [to_candidate(choice) for choice in reply.choices], reply


def step_request(
    messages: Sequence[BaseMessage],
    index: int,
    max_tokens: int,
    fmt: StepFormat,
    top_logprobs: int = 0,
    n: int = 1,
    extra_body: dict[str, Any] | None = None,
    role: Literal["backbone", "external"] = "backbone",
) -> Request:
    """The request for step `index`: it stops where the format ends a step, thinking off."""
    return Request(
        messages=messages,
        max_tokens=max_tokens,
        stop=fmt.stops(index),
        n=n,
        top_logprobs=top_logprobs or None,
        extra_body={**NON_THINKING, **(extra_body or {})},
        role=role,
    )


async def sample_step_watched(
    backbone: BaseChatModel,
    messages: Sequence[BaseMessage],
    *,
    index: int,
    max_tokens: int,
    fmt: StepFormat,
    top_logprobs: int,
    watch: TokenWatch,
) -> tuple[StepCandidate, Reply]:
    """One sample of step `index`, streamed and shown token by token to `watch`, which may
    stop it part-way (the candidate's finish_reason is then ABORTED)."""
    request = step_request(messages, index, max_tokens, fmt, top_logprobs)
    reply = await generate_watched(backbone, request, watch)
    return to_candidate(reply.choices[0]), reply


async def answer_fallback(
    backbone: BaseChatModel,
    question: str,
    system_prompt: str | None,
    kept_texts: Sequence[str],
    *,
    max_tokens: int,
    fmt: StepFormat = MARKER_FORMAT,
) -> tuple[str, int, Reply]:
    """After max_steps: one unconstrained continuation that asks for the answer.

    Returns the text (starting with the answer phrase, so extraction finds it), its tokens and
    the reply for accounting.
    """
    prefix = f"{fmt.solution(kept_texts)}{fmt.separator}{FALLBACK_PREFIX}"
    reply = await generate(
        backbone,
        Request(
            messages=[*conversation(question, system_prompt, fmt), AIMessage(prefix)],
            max_tokens=max_tokens,
            extra_body=NON_THINKING,
        ),
    )
    choice = reply.choices[0]
    return f"{FALLBACK_PREFIX}{choice.text}".strip(), choice.num_tokens, reply
