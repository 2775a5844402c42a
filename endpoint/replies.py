"""The replies, built from the `openai` package's own types (ChatCompletion, its chunk, Model):
what the reply holds besides OpenAI's fields is the extra `mur` (the step trace) and, on each
streamed step, `mur_step` (the step's event). The non-streamed reply and the model entry
declare their extra fields in subclasses; a chunk's ride in as pydantic extras.

The content is the kept steps as the backbone wrote them (`StepN: text` lines in the marker
format, paragraphs in the paragraph format), then the fallback text if any; the streamed
contents concatenate to the non-streamed content.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.encoders import jsonable_encoder
from openai.types import CompletionUsage, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from mur.endpoint.schemas import MODELS, Job
from mur.graphs import output_of
from mur.nodes.draft import STEP_FORMATS

OWNER = "mur"


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


def step_line(step: Mapping[str, Any], step_format: str = "marker") -> str:
    """One kept step of the content, in the format the backbone wrote it."""
    return STEP_FORMATS[step_format].line(step["index"], step["text"])


def trace_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The graph's output contract minus the question (the client sent it), as plain JSON
    values (records may hold dataclasses or sets)."""
    trace = {key: value for key, value in output_of(dict(result)).items() if key != "question"}
    return jsonable_encoder(trace)


def content_of(trace: Mapping[str, Any]) -> str:
    """The kept steps (see `step_line`), then the fallback text if any."""
    fallback = trace.get("fallback")
    step_format = (trace.get("config") or {}).get("step_format", "marker")
    steps = "".join(step_line(s, step_format) for s in trace.get("steps") or [])
    return steps + (fallback["text"] if fallback else "")


def usage_of(trace: Mapping[str, Any]) -> CompletionUsage:
    """OpenAI usage: completion = backbone + external generated tokens of the whole run."""
    usage = trace.get("usage") or {}
    prompt = int(usage.get("backbone_prompt_tokens", 0)) + int(
        usage.get("external_prompt_tokens", 0)
    )
    completion = int(usage.get("backbone_tokens", 0)) + int(usage.get("external_tokens", 0))
    return CompletionUsage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def completion(job: Job, trace: dict[str, Any], cid: str, created: int) -> MurChatCompletion:
    """The non-streamed reply: the whole solution as content, the trace as `mur`."""
    choice = Choice(
        index=0,
        message=ChatCompletionMessage(role="assistant", content=content_of(trace)),
        logprobs=None,
        finish_reason="stop",
    )
    return MurChatCompletion(
        id=cid,
        object="chat.completion",
        created=created,
        model=job.model,
        choices=[choice],
        usage=usage_of(trace),
        mur=trace,
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
