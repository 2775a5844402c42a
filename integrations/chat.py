"""A question read from a chat conversation, and its solution written as a chat reply: one
reading and one writing for the OpenAI-compatible endpoint (endpoint/) and the LangChain chat
model (integrations/chat_model.py `ChatMUR`), so the two cannot drift.

- A model name says the strategy and the gate: `mur-<strategy>` for the gamma-gate (the
  method itself), `mur-<strategy>-<gate>` else (`MODELS`).
- The question is the last user message, the system prompt the last system (or developer)
  message; content is a string or text parts.
- The content is the kept steps as the backbone wrote them (`StepN: text` lines in the marker
  format, paragraphs in the paragraph format), then the fallback text if any. Streamed, each
  kept step's line comes as it is kept and the fallback last; with several traces the steps of
  every trace stream with no text (only the vote says whose steps are the answer) and the
  voted trace's content comes last. Either way the streamed texts concatenate to the content.
- The trace is the graph's output contract without the question, as plain JSON values; the
  usage is the graph's counts in OpenAI's (completion = backbone + external generated tokens,
  prompt = both servers' prompt tokens).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from openai.types import CompletionUsage
from pydantic_core import to_jsonable_python

from mur.graphs.refine import STRATEGIES
from mur.graphs.state import Context, output_of
from mur.nodes.draft import STEP_FORMATS, check_question
from mur.nodes.gates import GATES

MODEL_PREFIX = "mur"


def model_name(strategy: str, gate: str) -> str:
    """`mur-<strategy>` for the gamma-gate (the method itself), `mur-<strategy>-<gate>` else."""
    return f"{MODEL_PREFIX}-{strategy}" if gate == "mur" else f"{MODEL_PREFIX}-{strategy}-{gate}"


MODELS: dict[str, tuple[str, str]] = {
    model_name(strategy, gate): (strategy, gate) for strategy in STRATEGIES for gate in GATES
}
"""Model name -> (strategy, gate): the endpoint's served models, ChatMUR's `model`."""

USER_ROLES = ("user", "human")
SYSTEM_ROLES = ("system", "developer")


class ConversationError(ValueError):
    """A conversation MUR cannot answer; `where` names the part at fault (`messages`, or
    `messages[2].content`)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


def text_of(content: Any, where: str) -> str:
    """Message content as text: a string, or the text parts of a content list."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        else:
            raise ConversationError(f"{where}: only text content is supported", where)
    return "".join(parts)


def question_of(messages: Iterable[tuple[str, Any]]) -> tuple[str, str | None]:
    """(question, system prompt) of a conversation given as (role, content) pairs: the last
    user message and the last system message. ConversationError without a user message, or
    with a question the graph would refuse."""
    question: str | None = None
    system: str | None = None
    for i, (role, content) in enumerate(messages):
        if role in USER_ROLES:
            question = text_of(content, f"messages[{i}].content")
        elif role in SYSTEM_ROLES:
            system = text_of(content, f"messages[{i}].content")
    if question is None:
        raise ConversationError(
            "the messages hold no user message: the last one is the question", "messages"
        )
    try:
        check_question(question)  # the graph's own check, before any model is asked
    except ValueError as exc:
        where = "messages"
        raise ConversationError(f"{exc} (the last user message is the question)", where) from None
    return question, system or None


def step_line(step: Mapping[str, Any], step_format: str = "marker") -> str:
    """One kept step of the content, in the format the backbone wrote it."""
    return STEP_FORMATS[step_format].line(step["index"], step["text"])


def content_of(trace: Mapping[str, Any]) -> str:
    """The kept steps (see `step_line`), then the fallback text if any."""
    fallback = trace.get("fallback")
    step_format = (trace.get("config") or {}).get("step_format", "marker")
    steps = "".join(step_line(s, step_format) for s in trace.get("steps") or [])
    return steps + (fallback["text"] if fallback else "")


def streamed_line(step: Mapping[str, Any], context: Context) -> str:
    """The text a kept step's event streams: its line with one trace, none with several."""
    return "" if context.traces > 1 else step_line(step, context.step_format)


def closing_text(trace: Mapping[str, Any], context: Context) -> str:
    """The text a stream ends with: the fallback with one trace (its steps were streamed),
    the voted trace's whole content with several."""
    if context.traces > 1:
        return content_of(trace)
    fallback = trace.get("fallback")
    return fallback["text"] if fallback else ""


def trace_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The graph's output contract minus the question (the caller sent it), as plain JSON
    values (records may hold dataclasses or sets)."""
    trace = {key: value for key, value in output_of(dict(result)).items() if key != "question"}
    jsonable: dict[str, Any] = to_jsonable_python(trace)
    return jsonable


def usage_of(usage: Mapping[str, Any]) -> CompletionUsage:
    """OpenAI usage of the graph's usage counts: completion = backbone + external generated
    tokens, prompt = both servers' prompt tokens."""
    prompt = int(usage.get("backbone_prompt_tokens", 0)) + int(
        usage.get("external_prompt_tokens", 0)
    )
    completion = int(usage.get("backbone_tokens", 0)) + int(usage.get("external_tokens", 0))
    return CompletionUsage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )
