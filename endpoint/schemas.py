"""The request: its pydantic model, the served model names, and `parse_job`, which turns a
validated body into one `Job` (strategy, gate, question, system prompt, graph Context).

Graph settings are validated by `graphs.Context` itself (the one source of settings), from the
request's JSON with strict types, so JSON `true` is no integer and `"0.8"` no number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
)

from mur.endpoint.errors import APIError, bad_request, describe_validation
from mur.graphs import Context
from mur.graphs.state import ContextError, context_for
from mur.integrations.chat import MODELS as MODELS
from mur.integrations.chat import ConversationError
from mur.integrations.chat import model_name as model_name
from mur.integrations.chat import question_of as read_question


class Message(BaseModel):
    """One chat message; only its role and text content matter here."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any] | str] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool = False


class ChatCompletionRequest(BaseModel):
    """A chat-completions body. OpenAI's sampling fields (`temperature`, `max_tokens`, ...) are
    accepted and ignored: sampling is the backbone client's (the paper's), the step cap is
    `mur.max_step_tokens`."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    seed: StrictInt | None = Field(default=None, description="The run's Context.seed.")
    mur: Any = Field(
        default=None,
        description="Graph settings: any graphs.Context field but `strategy` and `gate` (the "
        "model picks them).",
    )


@dataclass(frozen=True)
class Job:
    """One validated request: what to solve and how."""

    model: str
    strategy: str
    gate: str
    question: str
    system_prompt: str | None
    context: Context
    stream: bool
    include_usage: bool


def make_context(
    gate: str,
    mur: Any = None,
    seed: int | None = None,
    defaults: Mapping[str, Any] | None = None,
    strategy: str | None = None,
) -> Context:
    """The run's Context: `defaults`, then the top-level `seed`, then the `mur` field; the
    model name's `strategy` (None: the Context's default) and `gate` last.

    Unknown names and a `mur.strategy` or `mur.gate` other than the model's are 400s; values
    are checked by Context with strict JSON types (pydantic's ValidationError is a ValueError).
    """
    chosen = {"strategy": strategy or Context.model_fields["strategy"].default, "gate": gate}
    settings: dict[str, Any] = {k: v for k, v in (defaults or {}).items() if k not in chosen}
    if seed is not None:
        settings["seed"] = seed
    if mur is not None:
        if not isinstance(mur, Mapping):
            raise bad_request("mur must be an object of graph settings", "mur")
        names = set(Context.field_names())
        for key, value in mur.items():
            if key in chosen:
                if value != chosen[key]:
                    raise bad_request(
                        f"mur.{key} {value!r} contradicts the model's {key} {chosen[key]!r}: "
                        f"pick the {key} with the model name "
                        f"({model_name('critic', 'always')}, ...)",
                        f"mur.{key}",
                    )
                continue
            if key not in names:
                known = ", ".join(sorted(names - set(chosen)))
                raise bad_request(f"unknown setting mur.{key}: choose among {known}", f"mur.{key}")
            settings[key] = value
    try:
        return context_for(gate, {**settings, "strategy": chosen["strategy"]})  # strict types
    except ContextError as exc:
        if not exc.errors:
            raise bad_request(f"invalid graph settings: {exc}", "mur") from None
        message, param = describe_validation(exc.errors, prefix="mur")
        what = "invalid graph settings:" if param == "mur" else "invalid graph setting"
        raise bad_request(f"{what} {message}", param) from None


def question_of(messages: list[Message]) -> tuple[str, str | None]:
    """(question, system prompt): the last user message and the last system message, read as
    ChatMUR reads a conversation (integrations/chat.py); 400 naming the part at fault."""
    try:
        return read_question((message.role, message.content) for message in messages)
    except ConversationError as exc:
        raise bad_request(str(exc), exc.where) from None


def parse_job(request: ChatCompletionRequest, defaults: Mapping[str, Any] | None = None) -> Job:
    """The Job of a schema-valid body; APIError (400, or 404 for an unknown model) else."""
    if request.model not in MODELS:
        raise APIError(
            404,
            f"The model {request.model!r} does not exist: GET /v1/models lists the "
            f"{len(MODELS)} served ones (e.g. mur-critic, mur-best_of_n-always).",
            code="model_not_found",
            param="model",
        )
    strategy, gate = MODELS[request.model]
    if request.n is not None and request.n != 1:
        raise bad_request("n must be 1: one request runs one solution", "n")
    question, system = question_of(request.messages)
    context = make_context(gate, request.mur, request.seed, defaults, strategy)
    options = request.stream_options or StreamOptions()
    return Job(
        model=request.model,
        strategy=strategy,
        gate=gate,
        question=question,
        system_prompt=system,
        context=context,
        stream=bool(request.stream),
        include_usage=options.include_usage,
    )
