"""The replies, built from the `openai` package's own types (ChatCompletion, its chunk, Model):
what the reply holds besides OpenAI's fields is the extra `mur` (the step trace) and, on each
streamed step, `mur_step` (the step's event). The non-streamed reply and the model entry
declare their extra fields in subclasses; a chunk's ride in as pydantic extras.

The content, the trace and the usage are written by integrations/chat.py, as ChatMUR's message is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from mur.endpoint.schemas import MODELS, Job
from mur.graphs.traces import traces_line
from mur.integrations.chat import content_of, usage_of

OWNER = "mur"
Outcome = Literal["new", "resumed", "replayed"]


class MurModel(Model):
    """An entry of GET /v1/models: the model name and the strategy and gate it runs."""

    strategy: str
    gate: str


class MurChatCompletion(ChatCompletion):
    """The non-streamed reply: OpenAI's fields, and the step trace as `mur`."""

    mur: dict[str, Any]


def model_list(created: int) -> dict[str, Any]:
    """GET /v1/models: one model per strategy x gate, with its strategy and gate."""
    data = [
        MurModel(
            id=name, object="model", created=created, owned_by=OWNER, strategy=strategy, gate=gate
        ).model_dump(exclude_unset=True)
        for name, (strategy, gate) in MODELS.items()
    ]
    return {"object": "list", "data": data}


@dataclass(frozen=True)
class RunResult:
    """A run's output contract (`trace`), what this request generated (`request_usage`, in
    the graph's usage counts) and whether the run was new, resumed, or replayed from its
    recorded reply."""

    trace: dict[str, Any]
    request_usage: dict[str, int]
    outcome: Outcome


def reply_trace(trace: Mapping[str, Any], outcome: Outcome, key: str | None) -> dict[str, Any]:
    """The reply's `mur`: the run's trace (its `usage` the whole run's, in the graph's
    counts), `usage_total` (the whole run's in OpenAI's shape: the top-level `usage` is this
    request's), `run` (new, resumed or replayed; the idempotency key) and, with several
    traces, `traces_summary` (drawn, branched, stopped and the vote's tally, as `mur solve`
    prints it)."""
    summary = traces_line(trace.get("traces") or [])
    return {
        **trace,
        "usage_total": usage_of(trace.get("usage") or {}).model_dump(exclude_none=True),
        "run": {"outcome": outcome, "idempotency_key": key},
        **({"traces_summary": summary} if summary else {}),
    }


def completion(
    job: Job, result: RunResult, cid: str, created: int, key: str | None
) -> MurChatCompletion:
    """The non-streamed reply: the whole solution as content, the trace as `mur` (see
    `reply_trace`), `usage` what this request generated."""
    choice = Choice(
        index=0,
        message=ChatCompletionMessage(role="assistant", content=content_of(result.trace)),
        logprobs=None,
        finish_reason="stop",
    )
    return MurChatCompletion(
        id=cid,
        object="chat.completion",
        created=created,
        model=job.model,
        choices=[choice],
        usage=usage_of(result.request_usage),
        mur=reply_trace(result.trace, result.outcome, key),
    )


def chunk(
    job: Job,
    cid: str,
    created: int,
    delta: ChoiceDelta | None,
    finish: bool = False,
    **extra: Any,
) -> ChatCompletionChunk:
    """One streamed chunk; `delta=None` gives the choice-less usage chunk."""
    choices = (
        []
        if delta is None
        else [
            ChunkChoice(
                index=0, delta=delta, logprobs=None, finish_reason="stop" if finish else None
            )
        ]
    )
    return ChatCompletionChunk(
        id=cid,
        object="chat.completion.chunk",
        created=created,
        model=job.model,
        choices=choices,
        **extra,
    )


def dump(reply: ChatCompletion | ChatCompletionChunk) -> str:
    """JSON of a reply with only the fields that were set (as OpenAI sends them)."""
    return reply.model_dump_json(exclude_unset=True)
