"""One way to ask a chat model for text with token logprobs, and to count what it cost.

Models arrive injected: any LangChain chat model whose messages carry OpenAI-format token
logprobs in `response_metadata["logprobs"]["content"]` (what ChatOpenAI returns against vLLM).
Everything a node needs from a reply (text, per-token logprobs, why it stopped, tokens spent)
is read here, once, into plain dataclasses.

A server with a reasoning parser (vLLM `--reasoning-parser qwen3`) moves what it takes for
thinking out of `content` into a separate field, which LangChain clients keep in
`additional_kwargs["reasoning_content"]`. It does so whenever the request has thinking on, also
for a continued message whose prompt already closed the think block (vLLM 0.32). A node wants
what the model wrote, wherever the server filed it: `Generation.text` is the reasoning followed
by the content.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage

# The request fields that make vLLM continue the last assistant message instead of answering
# a new turn (its chat template must not add a generation prompt).
CONTINUE_FINAL_MESSAGE = {"continue_final_message": True, "add_generation_prompt": False}
LOGPROB_FLOOR = -1e4
T = TypeVar("T")


class MissingLogprobsError(RuntimeError):
    """The server answered without token logprobs, so no uncertainty can be measured."""


class ContextOverflowError(RuntimeError):
    """The request does not fit the model's context (the server answered HTTP 400).

    `room` is how many tokens the server could still have generated after this prompt, when
    its message says (vLLM states the prompt's size when prompt + max_tokens is too long); None
    when unknown or when the prompt alone is too long.
    """

    def __init__(self, message: str, max_context: int | None, prompt_tokens: int | None) -> None:
        super().__init__(message)
        self.max_context = max_context
        self.prompt_tokens = prompt_tokens

    @property
    def room(self) -> int | None:
        if self.max_context is None or self.prompt_tokens is None:
            return None
        return max(self.max_context - self.prompt_tokens, 0)


# vLLM's wording over the versions: "This model's maximum context length is 4096 tokens.
# However, your prompt contains at least 4097 input tokens ..." (0.2x; also when prompt +
# max_tokens is too long: "you requested 65535 output tokens and your prompt contains at
# least 62466 input tokens"), "... your request has 8 input tokens plus 2045 'max_tokens'"
# (0.15), "... you requested 5000 tokens (2952 in the messages, 2048 in the completion)"
# (0.1x), and "Input length (5000) exceeds model's maximum context length (4096)".
_MAX_CONTEXT = re.compile(r"maximum context length (?:is )?\(?(\d+)")
_PROMPT_TOKENS = re.compile(
    r"(?:contains (?:at least )?(\d+) input tokens|has (\d+) input tokens|(\d+) in the messages"
    r"|Input length \((\d+)\))"
)


def context_overflow(exc: BaseException) -> ContextOverflowError | None:
    """The overflow an HTTP 400 describes, or None when `exc` is something else."""
    import openai

    if not isinstance(exc, openai.BadRequestError):
        return None
    message = str(getattr(exc, "message", "") or exc)
    found = _MAX_CONTEXT.search(message)
    if found is None:
        return None
    prompt = _PROMPT_TOKENS.search(message)
    prompt_tokens = next((int(g) for g in prompt.groups() if g), None) if prompt else None
    return ContextOverflowError(message, int(found.group(1)), prompt_tokens)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the server was unreachable, slow, overloaded or failed (5xx).

    A 4xx answer (bad request, context overflow, unknown model) or a reply without logprobs
    will fail again the same way: those stop the question at once, with their own message.
    """
    # Local: the openai SDK takes seconds to import, and nodes run on any LangChain chat model;
    # an exception of the SDK's means it is already loaded.
    import openai

    if isinstance(exc, openai.APIConnectionError | openai.RateLimitError):
        return True  # includes timeouts
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500
    if isinstance(exc, httpx.TransportError | ConnectionError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    return False


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float


@dataclass(frozen=True)
class Generation:
    """One choice of a reply: its text and what the server said about each token."""

    text: str
    logprobs: tuple[float, ...]
    tokens: tuple[str, ...]
    top_logprobs: tuple[tuple[TopLogprob, ...], ...]
    finish_reason: str | None
    stop_reason: str | int | None = None
    stop_reason_known: bool = False
    stops: tuple[str, ...] = ()  # the request's stop strings
    reasoning: str = ""  # the part of `text` the server's reasoning parser filed separately

    @property
    def num_tokens(self) -> int:
        """Generated tokens of this choice: vLLM returns one logprob per generated token."""
        return len(self.logprobs)

    @property
    def ended_by_model(self) -> bool:
        """True when the model ended the sequence itself (EOS), not a stop string or a cap."""
        if self.finish_reason != "stop":
            return False
        if self.stop_reason_known:
            return self.stop_reason is None
        # Without vLLM's stop_reason (a stock ChatOpenAI drops it): the logprobs include the
        # tokens that completed a stop string, which the text leaves out; at EOS they end
        # with the end-of-sequence token instead.
        tail = "".join(self.tokens)[len(self.text) :]
        return not any(stop.strip() and stop.strip() in tail for stop in self.stops)


@dataclass(frozen=True)
class Usage:
    """Tokens a request (or a whole run) cost, split by model; one reply counted once."""

    backbone_tokens: int = 0
    external_tokens: int = 0
    backbone_prompt_tokens: int = 0
    external_prompt_tokens: int = 0
    llm_calls: int = 0
    """Requests the server answered (each counted once, whatever its n)."""
    failed_calls: int = 0
    """Requests that got no usable answer: 5xx, timeouts, cut connections, refusals (4xx)."""

    @property
    def generated_tokens(self) -> int:
        """Tokens generated by both models: what the benchmark tables count."""
        return self.backbone_tokens + self.external_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[int, ...]:
        return (
            self.backbone_tokens,
            self.external_tokens,
            self.backbone_prompt_tokens,
            self.external_prompt_tokens,
            self.llm_calls,
            self.failed_calls,
        )

    def as_dict(self) -> dict[str, int]:
        return dict(zip(USAGE_KEYS, self.as_tuple(), strict=True))


USAGE_KEYS: tuple[str, ...] = (
    "backbone_tokens",
    "external_tokens",
    "backbone_prompt_tokens",
    "external_prompt_tokens",
    "llm_calls",
    "failed_calls",
)


def add_usage(left: Mapping[str, int] | None, right: Mapping[str, int] | None) -> dict[str, int]:
    """State reducer: usage deltas from nodes add up (missing keys count as 0)."""
    left, right = left or {}, right or {}
    return {key: int(left.get(key, 0)) + int(right.get(key, 0)) for key in USAGE_KEYS}


@dataclass(frozen=True)
class Reply:
    """All choices of one or more requests, with the tokens they cost."""

    choices: tuple[Generation, ...]
    completion_tokens: int
    prompt_tokens: int
    calls: int

    def usage(self, role: str) -> Usage:
        if role == "backbone":
            return Usage(self.completion_tokens, 0, self.prompt_tokens, 0, self.calls)
        if role == "external":
            return Usage(0, self.completion_tokens, 0, self.prompt_tokens, self.calls)
        raise ValueError(f"role must be 'backbone' or 'external', got {role!r}")


@dataclass
class CallMeter:
    """Every request made while it is active: what the answered ones cost, how many failed.

    The graph runs each attempt of a model-calling node under a fresh meter (`metered`), so the
    tokens of requests answered in an attempt that then fails are not lost with it.
    """

    answered: Usage = field(default_factory=Usage)
    failed_calls: int = 0

    def total(self) -> Usage:
        return self.answered + Usage(failed_calls=self.failed_calls)


_METERS: ContextVar[tuple[CallMeter, ...]] = ContextVar("mur_call_meters", default=())


@contextmanager
def metered(meter: CallMeter | None = None) -> Iterator[CallMeter]:
    """Count the requests made in this context (and in tasks started from it), in `meter` or
    a fresh one. Meters nest: each active one counts every request, so a benchmark's run-wide
    meter sees the tokens of questions still in flight while the graph meters each attempt."""
    meter = meter if meter is not None else CallMeter()
    token = _METERS.set((*_METERS.get(), meter))
    try:
        yield meter
    finally:
        _METERS.reset(token)


def _count(usage: Usage | None = None, *, failed: bool = False) -> None:
    """Add a request's outcome to every active meter."""
    for meter in _METERS.get():
        if failed:
            meter.failed_calls += 1
        if usage is not None:
            meter.answered += usage


@dataclass(frozen=True)
class Request:
    """What to ask for, independent of the client library."""

    messages: Sequence[BaseMessage]
    max_tokens: int
    stop: Sequence[str] | None = None
    n: int = 1
    continue_final_message: bool = True
    top_logprobs: int | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    role: Literal["backbone", "external"] = "backbone"
    """Whose tokens these are in the usage (the verifier's are external)."""

    def payload_kwargs(self, model: BaseChatModel) -> dict[str, Any]:
        extra: dict[str, Any] = dict(getattr(model, "extra_body", None) or {})
        if self.continue_final_message:
            extra.update(CONTINUE_FINAL_MESSAGE)
        extra.update(self.extra_body)
        kwargs: dict[str, Any] = {"max_tokens": self.max_tokens, "extra_body": extra}
        if self.stop:
            kwargs["stop"] = list(self.stop)
        if self.top_logprobs:
            kwargs["top_logprobs"] = self.top_logprobs
        return kwargs


def _parse_generation(
    message: BaseMessage, info: Mapping[str, Any] | None, stops: Sequence[str] | None
) -> Generation:
    metadata: dict[str, Any] = {**(info or {}), **message.response_metadata}
    content = metadata.get("logprobs")
    entries = content.get("content") if isinstance(content, Mapping) else None
    if entries is None:
        raise MissingLogprobsError(
            "the model's reply carries no token logprobs: MUR measures uncertainty from them. "
            "Serve the model with vLLM (or any OpenAI-compatible server that honours "
            "logprobs=true) and use a client created with logprobs=True"
        )
    logprobs, tokens, tops = [], [], []
    for entry in entries:
        logprob = float(entry["logprob"])
        if math.isnan(logprob):
            raise ValueError(f"the server returned a NaN logprob for token {entry.get('token')!r}")
        # vLLM can report -inf for a token it was forced to emit; keep the mean a number.
        logprobs.append(max(logprob, LOGPROB_FLOOR))
        tokens.append(str(entry.get("token", "")))
        tops.append(
            tuple(
                TopLogprob(str(top.get("token", "")), float(top["logprob"]))
                for top in entry.get("top_logprobs") or ()
            )
        )
    content = message.content if isinstance(message.content, str) else message.text
    reasoning = message.additional_kwargs.get("reasoning_content") or ""
    if not isinstance(reasoning, str):
        raise ValueError(f"the reply's reasoning_content is not text: {reasoning!r}")
    return Generation(
        text=reasoning + content,
        reasoning=reasoning,
        logprobs=tuple(logprobs),
        tokens=tuple(tokens),
        top_logprobs=tuple(tops),
        finish_reason=metadata.get("finish_reason"),
        stop_reason=metadata.get("stop_reason"),
        stop_reason_known="stop_reason" in metadata,
        stops=tuple(stops or ()),
    )


def _reply_usage(message: BaseMessage, choices: Sequence[Generation]) -> tuple[int, int]:
    usage = getattr(message, "usage_metadata", None) if isinstance(message, AIMessage) else None
    if usage:
        return int(usage.get("output_tokens", 0)), int(usage.get("input_tokens", 0))
    # No usage reported: vLLM returns one logprob per generated token, so count those.
    return sum(choice.num_tokens for choice in choices), 0


async def _one_request(model: BaseChatModel, request: Request, n: int) -> Reply:
    kwargs = request.payload_kwargs(model)
    if n > 1:
        kwargs["n"] = n
    try:
        result = await model.agenerate([list(request.messages)], **kwargs)
    except BaseException as exc:  # cancelled too: the request got no usable answer
        _count(failed=True)
        overflow = context_overflow(exc)
        if overflow is not None:
            raise overflow from exc
        raise
    generations = result.generations[0]
    try:
        choices = tuple(
            _parse_generation(g.message, g.generation_info, request.stop) for g in generations
        )
    except Exception:  # an unusable reply still cost what the server reports
        completion, prompt = _reply_usage(generations[0].message, ())
        _count(Reply((), completion, prompt, calls=1).usage(request.role))
        raise
    # Every message of a multi-choice reply carries the whole reply's usage: count it once.
    completion, prompt = _reply_usage(generations[0].message, choices)
    reply = Reply(choices, completion, prompt, calls=1)
    _count(reply.usage(request.role))
    return reply


async def gather_all(*awaitables: Awaitable[T]) -> list[T]:
    """Like `asyncio.gather`, but the first failure cancels the others and is raised as is.

    With plain gather the sibling requests of a failed one keep running unseen, spending
    server time and tokens after their node has failed (and while its retry runs).
    """
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_awaited(item)) for item in awaitables]
    except BaseExceptionGroup as failed:
        raise _first_leaf(failed) from None
    return [task.result() for task in tasks]


async def _awaited(item: Awaitable[T]) -> T:
    return await item


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def supports_n_choices(model: BaseChatModel) -> bool:
    """Only clients that declare it get n > 1 in one request (stock ChatOpenAI shares one
    generation_info between choices, so every choice would report the last one's logprobs)."""
    return bool(getattr(model, "supports_n_choices", False))


async def generate(model: BaseChatModel, request: Request) -> Reply:
    """Ask for `request.n` choices: in one request where the client supports it, else
    concurrently; a reply with fewer choices than asked is topped up with more requests."""
    if request.n < 1:
        raise ValueError(f"n must be >= 1, got {request.n}")
    if request.n > 1 and supports_n_choices(model):
        first = await _one_request(model, request, request.n)
    else:
        first = await _one_request(model, request, 1)
    missing = request.n - len(first.choices)
    if missing <= 0:
        return Reply(first.choices[: request.n], first.completion_tokens, first.prompt_tokens, 1)
    more = await gather_all(*(_one_request(model, request, 1) for _ in range(missing)))
    replies = [first, *more]
    return Reply(
        choices=tuple(c for reply in replies for c in reply.choices)[: request.n],
        completion_tokens=sum(r.completion_tokens for r in replies),
        prompt_tokens=sum(r.prompt_tokens for r in replies),
        calls=sum(r.calls for r in replies),
    )
