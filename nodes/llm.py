"""One way to ask a chat model for text with token logprobs, and to read its reply.

Models arrive injected: any LangChain chat model whose messages carry OpenAI-format token
logprobs in `response_metadata["logprobs"]["content"]` (what ChatOpenAI returns against vLLM).
Everything a node needs from a reply (text, per-token logprobs, why it stopped, tokens spent)
is read here, once, into plain dataclasses; each request's cost goes to the active meters
(`nodes.usage`). A failed request raises what the client raised: what a client's exception
means (retry it, the context is full) is the client layer's to say
(servers.clients.transport_errors), and the graph's to act on.

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
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables import ensure_config

from mur.nodes.usage import Usage, count_request

# The request fields that make vLLM continue the last assistant message instead of answering
# a new turn (its chat template must not add a generation prompt).
CONTINUE_FINAL_MESSAGE = {"continue_final_message": True, "add_generation_prompt": False}
LOGPROB_FLOOR = -1e4
T = TypeVar("T")


class MissingLogprobsError(RuntimeError):
    """The server answered without token logprobs, so no uncertainty can be measured."""


@dataclass(frozen=True)
class Generation:
    """One choice of a reply: its text and what the server said about each token."""

    text: str
    logprobs: tuple[float, ...]
    tokens: tuple[str, ...]
    top_logprobs: tuple[tuple[float, ...], ...]
    """Each token's top-k logprobs as the server ranked them (empty tuples when not asked)."""
    top_tokens: tuple[tuple[str, ...], ...]
    """The tokens of `top_logprobs`, in the same order. Kept apart as plain tuples: a reply at
    top_logprobs 20 has thousands of them, and one object each was the client's largest
    cost against a fast server (`mur bench client`)."""
    finish_reason: str | None
    stop_reason: str | int | None = None
    stop_reason_known: bool = False
    stops: tuple[str, ...] = ()  # the request's stop strings
    reasoning: str = ""  # the part of `text` the server's reasoning parser filed separately
    prompt_logprobs: tuple[tuple[str, float], ...] = ()
    """Each prompt token (as the server decoded it) with its logprob under the model, when the
    request asked for vLLM's `prompt_logprobs` (the first token, which has none, left out)."""

    @property
    def num_tokens(self) -> int:
        """Generated tokens of this choice: vLLM returns one logprob per generated token."""
        return len(self.logprobs)

    def alternatives(self, index: int) -> dict[str, float]:
        """Token `index`'s top-k tokens with their logprobs."""
        return dict(zip(self.top_tokens[index], self.top_logprobs[index], strict=True))

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
    logprobs, tokens, tops, top_tokens = [], [], [], []
    for entry in entries:
        logprob = float(entry["logprob"])
        if math.isnan(logprob):
            raise ValueError(f"the server returned a NaN logprob for token {entry.get('token')!r}")
        # vLLM can report -inf for a token it was forced to emit; keep the mean a number.
        logprobs.append(max(logprob, LOGPROB_FLOOR))
        tokens.append(str(entry.get("token", "")))
        ranked = entry.get("top_logprobs") or ()
        tops.append(tuple([float(top["logprob"]) for top in ranked]))
        top_tokens.append(tuple([str(top.get("token", "")) for top in ranked]))
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
        top_tokens=tuple(top_tokens),
        finish_reason=metadata.get("finish_reason"),
        stop_reason=metadata.get("stop_reason"),
        stop_reason_known="stop_reason" in metadata,
        stops=tuple(stops or ()),
        prompt_logprobs=_prompt_logprobs(metadata.get("prompt_logprobs")),
    )


def _prompt_logprobs(entries: Any) -> tuple[tuple[str, float], ...]:
    """vLLM's `prompt_logprobs` (one entry per prompt token: None for the first, else a dict
    of token id to {logprob, rank, decoded_token}, the prompt's own token the one of
    `prompt_logprobs=0`) as (token, logprob) pairs; () when the reply has none."""
    if not entries:
        return ()
    pairs = []
    for entry in entries:
        if entry is None:
            continue
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise ValueError(
                "each prompt_logprobs entry must hold the prompt's own token only (ask with "
                f"prompt_logprobs=0), got {entry!r:.200}"
            )
        (ranked,) = entry.values()
        logprob = float(ranked["logprob"])
        pairs.append((str(ranked.get("decoded_token") or ""), max(logprob, LOGPROB_FLOOR)))
    return tuple(pairs)


def _reply_usage(message: BaseMessage, choices: Sequence[Generation]) -> tuple[int, int]:
    usage = getattr(message, "usage_metadata", None) if isinstance(message, AIMessage) else None
    if usage:
        return int(usage.get("output_tokens", 0)), int(usage.get("input_tokens", 0))
    # No usage reported: vLLM returns one logprob per generated token, so count those.
    return sum(choice.num_tokens for choice in choices), 0


def _chat_generations(result: LLMResult) -> list[ChatGeneration]:
    """The generations of a chat model's one prompt: ChatGenerations, each with its message
    (LLMResult's type allows any generation)."""
    generations = result.generations[0]
    chats = [g for g in generations if isinstance(g, ChatGeneration)]
    if len(chats) != len(generations):
        raise TypeError("the chat model returned a generation without a message")
    return chats


async def _one_request(model: BaseChatModel, request: Request, n: int) -> Reply:
    kwargs = request.payload_kwargs(model)
    if n > 1:
        kwargs["n"] = n
    # The node's callbacks (its config, which `astream` reads itself): the request is a chat
    # model run beneath its node for every handler, so token meters and tracers see it once
    # (ChatMUR's own run reports none: integrations/chat_model.py). stream=False: a streaming
    # handler (LangGraph's messages mode) must not turn the request into a stream.
    callbacks = ensure_config().get("callbacks")
    try:
        result = await model.agenerate(
            [list(request.messages)], callbacks=callbacks, stream=False, **kwargs
        )
    except BaseException:  # cancelled too: the request got no usable answer
        count_request(failed=True)
        raise  # as the client raised it: the graph judges what it means (retry, full context)
    generations = _chat_generations(result)
    try:
        choices = tuple(
            _parse_generation(g.message, g.generation_info, request.stop) for g in generations
        )
    except Exception:  # an unusable reply still cost what the server reports
        completion, prompt = _reply_usage(generations[0].message, ())
        count_request(Reply((), completion, prompt, calls=1).usage(request.role))
        raise
    # Every message of a multi-choice reply carries the whole reply's usage: count it once.
    completion, prompt = _reply_usage(generations[0].message, choices)
    reply = Reply(choices, completion, prompt, calls=1)
    count_request(reply.usage(request.role))
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


TokenWatch = Callable[[Sequence[float]], bool]
"""Sees each generated token's top logprobs as it arrives; True stops the request there."""
ABORTED = "abort"
"""A watched request's finish_reason when its watch stopped it (vLLM's word for a request
that was cut off before it finished)."""
# Per-chunk usage (vLLM's `continuous_usage_stats`): what the server generated so far is known
# at every token, not only at the end a stopped stream never reaches.
_STREAM_OPTIONS = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


async def generate_watched(model: BaseChatModel, request: Request, watch: TokenWatch) -> Reply:
    """One choice, streamed, each token shown to `watch` as it arrives. When the watch says
    stop, the stream is closed, so the server aborts the request and generates no more; the
    choice then ends at that token with finish_reason ABORTED. The reply's usage is what the
    chunks read add up to (at least the tokens read; a vLLM client reports each chunk's share,
    servers.clients.chat_models): tokens the server generated after the last chunk read and
    before it saw the connection close are not in it (docs/faults.md).
    """
    if request.n != 1:
        raise ValueError(f"a watched request has one choice, got n={request.n}")
    kwargs = request.payload_kwargs(model)
    kwargs["extra_body"] = {**kwargs["extra_body"], **_STREAM_OPTIONS}
    entries: list[dict[str, Any]] = []
    content: list[str] = []
    metadata: dict[str, Any] = {}
    completion = prompt = 0
    cut: int | None = None
    # An async generator (typed as an iterator): closing it closes the HTTP stream.
    chunks = model.astream(list(request.messages), **kwargs)
    stream = cast(AsyncGenerator[AIMessageChunk, None], chunks)
    try:
        async for chunk in stream:
            content.append(chunk.text)
            # Later chunks say more (finish_reason); stop_reason None means the model ended.
            metadata.update(
                (key, value)
                for key, value in chunk.response_metadata.items()
                if value is not None or key == "stop_reason"
            )
            if chunk.usage_metadata:  # what the chunk adds, as LangChain sums them
                completion += int(chunk.usage_metadata.get("output_tokens", 0))
                prompt += int(chunk.usage_metadata.get("input_tokens", 0))
            logprobs = chunk.response_metadata.get("logprobs") or {}
            for entry in logprobs.get("content") or ():
                entries.append(entry)
                tops = [float(top["logprob"]) for top in entry.get("top_logprobs") or ()]
                if cut is None and watch(tops):
                    cut = len(entries)
            if cut is not None:
                break
    except BaseException:  # cancelled too: the request got no usable answer
        count_request(failed=True)
        raise
    finally:
        await stream.aclose()  # closes the connection: vLLM aborts a request still running
    kept = entries[:cut] if cut is not None else entries
    message = AIMessage(
        content="".join(str(e.get("token", "")) for e in kept)
        if cut is not None
        else "".join(content),
        response_metadata={
            **metadata,
            "logprobs": {"content": kept},
            "finish_reason": ABORTED if cut is not None else metadata.get("finish_reason"),
        },
    )
    choice = _parse_generation(message, None, request.stop)
    reply = Reply((choice,), max(completion, len(entries)), prompt, calls=1)
    count_request(reply.usage(request.role))
    return reply
