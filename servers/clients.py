"""Client factory: LangChain chat models bound to a vLLM server, with the paper's sampling.

Why a subclass of ChatOpenAI:
- every sampling parameter is sent explicitly: vLLM otherwise falls back to the model's
  `generation_config.json`, which differs per model and would silently change results;
- a call-time `extra_body` is MERGED into the constructor's (stock langchain-openai replaces
  it, so e.g. `top_k` or `continue_final_message` vanish without a word);
- every request of one question carries its session id (`X-Session-ID`, see
  `servers.sessions`), so a vllm-router in front of replicas keeps the question on one replica;
- vLLM's `stop_reason` (the stop string or token id that ended a choice; None for EOS or
  length) is kept in `response_metadata` next to `finish_reason` (stock ChatOpenAI drops it);
- the async HTTP client keeps no idle connections, so one model object works across several
  `asyncio.run()` calls (stock ChatOpenAI shares one cached pooled client per base URL, and a
  connection left over from a closed event loop fails with "Event loop is closed").
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.outputs import ChatResult
from langchain_openai import ChatOpenAI

from servers.errors import ServerUnavailable
from servers.launcher import check_endpoint, normalize_base_url
from servers.profiles import DEFAULT_PROFILE, get_profile
from servers.sessions import session_headers

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


def loop_safe_async_http_client() -> Any:
    """An async HTTP client for the openai SDK that keeps no idle connections.

    A pooled keep-alive connection belongs to the event loop that opened it; reusing it from a
    later loop raises "Event loop is closed". Opening a fresh connection per request costs well
    under a millisecond against a local server, negligible next to generation.
    """
    import openai

    client_cls = openai.DefaultAsyncHttpxClient
    # The SDK's HTTP library (httpx, or httpx2 in newer SDKs): take Limits from the same one.
    base = next(c for c in client_cls.__mro__ if c.__name__ == "AsyncClient")
    httpx_mod = importlib.import_module(base.__module__.split(".")[0])
    return client_cls(limits=httpx_mod.Limits(max_connections=1000, max_keepalive_connections=0))


class VLLMChatOpenAI(ChatOpenAI):
    """ChatOpenAI for vLLM: merged `extra_body`, the session header, vLLM `stop_reason` kept."""

    supports_n_choices: bool = True
    """Each of n choices keeps its own logprobs here, so callers may ask for n > 1 at once."""

    def _get_request_payload(
        self,
        input_: Any,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> dict:
        """Merge call-time `extra_body` over the constructor's instead of replacing it; add
        the current session's `X-Session-ID` header (`servers.sessions`)."""
        call_extra = kwargs.pop("extra_body", None)
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        if call_extra:
            payload["extra_body"] = {**(self.extra_body or {}), **call_extra}
        headers = session_headers()
        if headers:
            payload["extra_headers"] = {**(payload.get("extra_headers") or {}), **headers}
        return payload

    def _create_chat_result(
        self,
        response: Any,
        generation_info: dict | None = None,
    ) -> ChatResult:
        """Keep vLLM's non-OpenAI `stop_reason` per choice (the stock method drops it)."""
        result = super()._create_chat_result(response, generation_info)
        data = response if isinstance(response, dict) else response.model_dump()
        choices = data.get("choices") or []
        for gen, choice in zip(result.generations, choices, strict=False):
            info = dict(generation_info or {})
            info["finish_reason"] = choice.get("finish_reason")
            if "logprobs" in choice:
                info["logprobs"] = choice["logprobs"]
            if "stop_reason" in choice:
                info["stop_reason"] = choice["stop_reason"]
            gen.generation_info = info
        return result


@dataclass(frozen=True)
class Endpoint:
    """Where a model is served: OpenAI-compatible base URL and model name (None: ask server)."""

    base_url: str
    model: str | None


def default_endpoints() -> tuple[Endpoint, Endpoint]:
    """(backbone, verifier) endpoints from the environment, else the cpu-tiny profile.

    Backbone: `MUR_BASE_URL` / `MUR_MODEL`. Verifier: `MUR_VERIFIER_URL` /
    `MUR_VERIFIER_MODEL`, defaulting to the backbone (the model judges its own steps).
    A URL given without a model name resolves the model from the server's /v1/models.
    """
    tiny = get_profile(DEFAULT_PROFILE)
    env_url = os.environ.get("MUR_BASE_URL", "").strip()
    env_model = os.environ.get("MUR_MODEL", "").strip() or None
    if env_url:
        backbone = Endpoint(normalize_base_url(env_url), env_model)
    else:
        backbone = Endpoint(tiny.base_url, env_model or tiny.served_model_name)
    ver_url = os.environ.get("MUR_VERIFIER_URL", "").strip()
    ver_model = os.environ.get("MUR_VERIFIER_MODEL", "").strip() or None
    if ver_url:
        verifier = Endpoint(normalize_base_url(ver_url), ver_model)
    elif ver_model:
        verifier = Endpoint(backbone.base_url, ver_model)
    else:
        verifier = backbone
    return backbone, verifier


def resolve_model(base_url: str, timeout: float = 5) -> str:
    """The model served at `base_url` (the first listed), or ServerUnavailable."""
    models = check_endpoint(base_url, timeout=timeout)
    if not models:
        raise ServerUnavailable(
            f"the server at {normalize_base_url(base_url)} serves no model: restart it with "
            "`python -m servers up`"
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
    `top_logprobs`, `timeout`); an `extra_body` override is merged with the sampling one.
    `logprobs=True` is on so every reply carries per-token logprobs in
    `response_metadata["logprobs"]["content"]`.
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
    api_key = os.environ.get("OPENAI_API_KEY") or "EMPTY"
    return VLLMChatOpenAI(
        base_url=url,
        model=name,
        api_key=api_key,
        use_responses_api=False,
        http_async_client=overrides.pop("http_async_client", None) or loop_safe_async_http_client(),
        extra_body=extra,
        **params,
        **overrides,
    )
