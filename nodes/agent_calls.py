"""An agent's model calls read as MUR reads steps: pure functions of a reply's token logprobs
(uncertainty, confidence, the first token's entropy, its usage) and the vote among draws of
one call. integrations/middleware.py (`MURMiddleware`) acts on them.

A reply's logprobs are OpenAI's format, as nodes/llm.py reads them:
`response_metadata["logprobs"]["content"]`, one entry per generated token (vLLM includes the
tokens of a tool call it parsed into `tool_calls`), -inf floored at LOGPROB_FLOOR.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.messages.ai import UsageMetadata

from mur.nodes.confidence import token_entropy
from mur.nodes.llm import LOGPROB_FLOOR, MissingLogprobsError
from mur.nodes.uncertainty import step_confidence, step_uncertainty

NO_LOGPROBS = (
    "the agent's model{model} replied without token logprobs: MURMiddleware measures each "
    "call's uncertainty from them and asks for them (logprobs=True). Use a chat model that "
    "returns OpenAI-format logprobs, e.g. ChatOpenAI against vLLM or another OpenAI-compatible "
    "server that honours logprobs"
)


@dataclass(frozen=True)
class CallReading:
    """What one reply says of how sure the model was, and what it cost."""

    uncertainty: float
    confidence: float
    first_token_entropy: float | None
    usage: UsageMetadata


def logprob_entries(message: AIMessage) -> list[Mapping[str, Any]] | None:
    """The reply's OpenAI-format token logprobs (`response_metadata["logprobs"]["content"]`,
    as nodes/llm.py reads them); None when it has none."""
    logprobs = message.response_metadata.get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    return None if entries is None else list(entries)


def _logprob(entry: Mapping[str, Any]) -> float:
    value = float(entry["logprob"])
    if math.isnan(value):
        raise ValueError(f"the server returned a NaN logprob for token {entry.get('token')!r}")
    return max(value, LOGPROB_FLOOR)  # vLLM reports -inf for a forced token: keep a number


def call_usage(message: AIMessage, generated: int) -> UsageMetadata:
    """The reply's usage as LangChain reports it; without one, its logprobs counted (vLLM
    returns one per generated token)."""
    if message.usage_metadata:
        return message.usage_metadata
    return UsageMetadata(input_tokens=0, output_tokens=generated, total_tokens=generated)


def read_call(message: AIMessage, top_logprobs: int = 0) -> CallReading:
    """Uncertainty (mean -logprob), confidence and, when top logprobs were asked, the first
    token's entropy of one reply; MissingLogprobsError (one line) for a reply without them."""
    entries = logprob_entries(message)
    if entries is None:
        name = message.response_metadata.get("model_name")
        raise MissingLogprobsError(NO_LOGPROBS.format(model=f" {name}" if name else ""))
    if not entries:
        raise ValueError(
            "the agent's model generated no token in this call, so it has no uncertainty: "
            "check the request's max_tokens"
        )
    logprobs = [_logprob(entry) for entry in entries]
    entropy = None
    if top_logprobs:
        first = entries[0].get("top_logprobs") or ()
        entropy = token_entropy([_logprob(top) for top in first])
    return CallReading(
        uncertainty=step_uncertainty(logprobs),
        confidence=step_confidence(logprobs),
        first_token_entropy=entropy,
        usage=call_usage(message, len(logprobs)),
    )


def _normalised(value: Any) -> Any:
    """Arguments as a tool would read them: integral floats as integers, strings stripped."""
    if isinstance(value, Mapping):
        return {str(key): _normalised(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_normalised(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return value.strip()
    return value


def agreement_key(message: AIMessage) -> Hashable:
    """What two draws share when they agree: the same tool calls (names and normalised
    arguments, in any order), or, answering in words, the same text up to whitespace."""
    calls = sorted(
        (call["name"], json.dumps(_normalised(call["args"]), sort_keys=True, ensure_ascii=False))
        for call in message.tool_calls
    )
    broken = sorted(
        (call.get("name") or "", " ".join((call.get("args") or "").split()))
        for call in message.invalid_tool_calls
    )
    if calls or broken:
        return ("tools", tuple(calls), tuple(broken))
    return ("text", " ".join(message.text.split()))


def vote(keys: Sequence[Hashable], uncertainties: Sequence[float]) -> tuple[int, list[int]]:
    """The draw to keep (among those most draws agree with, the least uncertain; the earlier
    on equal uncertainty) and each draw's votes (how many draws agree with it)."""
    counts = Counter(keys)
    votes = [counts[key] for key in keys]
    most = max(votes)
    leaders = [index for index, count in enumerate(votes) if count == most]
    return min(leaders, key=lambda index: uncertainties[index]), votes


def measured_uncertainty(message: AIMessage) -> tuple[float | None, UsageMetadata]:
    """A reply's uncertainty when it carries logprobs (None otherwise), and its usage: what is
    recorded of a model that need not return logprobs (an escalation's stronger model)."""
    entries = logprob_entries(message)
    uncertainty = step_uncertainty([_logprob(e) for e in entries]) if entries else None
    return uncertainty, call_usage(message, len(entries or ()))


def last_user_text(messages: Sequence[BaseMessage]) -> str:
    """The run's question as the gates' seed reads it: the last user message's text."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.text
    return ""
