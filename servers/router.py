"""Scale-out: one LangChain chat model over several replicas of the same vLLM model.

Why a chat model and not a proxy: the graph already takes any chat model, so routing inside the
client needs no extra process, keeps every reply exactly as the replica returned it (logprobs,
`stop_reason`, usage counted once per reply by `nodes.llm.generate`), and works against plain
`vllm serve` replicas on any hosts. Each request goes to the replica with the fewest requests
in flight from this process (ties take turns), which keeps every replica's batch equally full
when MUR's requests have very different lengths. A replica that refuses connections is skipped
for a short cool-off and the request goes to the next one; only when every replica refuses
does the caller see the (last) error, which the graph's retry policy treats as transient.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from pydantic import ConfigDict, Field, PrivateAttr

from servers.clients import VLLMChatOpenAI, make_chat_model
from servers.errors import ServerError
from servers.launcher import check_endpoint, normalize_base_url

COOL_OFF_S = 5.0
"""Seconds a replica that refused a connection is skipped (unless every replica is down)."""


def split_urls(value: str | Sequence[str]) -> list[str]:
    """`"http://a:8000/v1,http://b:8000/v1"` (or a list of such strings) -> one URL each.

    The same URL may appear twice on purpose (two routing slots for one server), so nothing is
    deduplicated.
    """
    items = [value] if isinstance(value, str) else list(value)
    urls = [url.strip() for item in items for url in item.split(",") if url.strip()]
    if not urls:
        raise ServerError("no server URL given: pass one or more comma-separated URLs")
    return urls


def refused(exc: BaseException) -> bool:
    """The request never reached a server (connection refused / host unreachable).

    Only then is it safe to send it elsewhere at once: a timeout or a connection cut mid-reply
    may mean the replica is busy generating it, and is left to the caller's retry policy.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # httpx / httpx2 / httpcore all name it ConnectError; openai wraps it.
        if isinstance(current, ConnectionRefusedError) or type(current).__name__ in (
            "ConnectError",
            "ConnectionRefusedError",
        ):
            return True
        if type(current).__name__ in ("APITimeoutError", "TimeoutException", "ConnectTimeout"):
            return False
        current = current.__cause__ or current.__context__
    return False


class RoutedChatModel(BaseChatModel):
    """Sends each request to the least-loaded of several replicas of the same model.

    Load is requests in flight from this object; ties go round-robin. The chosen replica's
    `_agenerate`/`_generate` runs with the call's messages, stop and kwargs unchanged, and its
    ChatResult is returned as is. A replica that refuses the connection is marked down for
    `cool_off_s` and the next one is tried; replicas in cool-off are tried last, so a request
    fails only after every replica refused it (raising the last error).

    Streaming is not routed (no `_astream`): the graph's nodes call `agenerate`, and a
    half-streamed reply could not fail over. Callbacks configured on a replica itself do not
    fire; the router's own run manager is passed down instead.
    """

    replicas: list[BaseChatModel] = Field(min_length=1)
    cool_off_s: float = COOL_OFF_S
    clock: Callable[[], float] = time.monotonic

    model_config = ConfigDict(arbitrary_types_allowed=True)

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _in_flight: list[int] = PrivateAttr(default_factory=list)
    _served: list[int] = PrivateAttr(default_factory=list)
    _down_until: list[float] = PrivateAttr(default_factory=list)
    _cursor: int = PrivateAttr(default=0)

    def model_post_init(self, context: Any, /) -> None:
        count = len(self.replicas)
        self._in_flight = [0] * count
        self._served = [0] * count
        self._down_until = [0.0] * count

    # ------------------------------------------------------------------ what callers read

    @property
    def _llm_type(self) -> str:
        return "routed-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"replicas": [dict(r._identifying_params) for r in self.replicas]}

    @property
    def extra_body(self) -> dict[str, Any] | None:
        """The first replica's request extras (`nodes.llm` merges them into every request)."""
        return getattr(self.replicas[0], "extra_body", None)

    @property
    def supports_n_choices(self) -> bool:
        """n > 1 in one request only if every replica keeps per-choice logprobs."""
        return all(bool(getattr(r, "supports_n_choices", False)) for r in self.replicas)

    @property
    def model_name(self) -> str | None:
        """The served model name (the same on every replica)."""
        return getattr(self.replicas[0], "model_name", None)

    @property
    def openai_api_base(self) -> str:
        """Every replica's base URL, comma-separated (as `--base-url` takes them)."""
        return ",".join(str(getattr(r, "openai_api_base", "?")) for r in self.replicas)

    @property
    def in_flight(self) -> list[int]:
        """Requests now running on each replica (from this object)."""
        with self._lock:
            return list(self._in_flight)

    @property
    def served(self) -> list[int]:
        """Requests sent to each replica so far (refused ones included)."""
        with self._lock:
            return list(self._served)

    def _combine_llm_outputs(self, llm_outputs: list[dict | None]) -> dict:
        return self.replicas[0]._combine_llm_outputs(llm_outputs)

    # ------------------------------------------------------------------------ routing

    def _choose(self, tried: set[int]) -> int | None:
        """Least in flight among untried replicas that are up, else among the down ones."""
        now = self.clock()
        with self._lock:
            count = len(self.replicas)
            order = [(self._cursor + k) % count for k in range(count)]
            untried = [i for i in order if i not in tried]
            if not untried:
                return None
            up_now = [i for i in untried if self._down_until[i] <= now]
            pool = up_now or sorted(untried, key=lambda i: self._down_until[i])
            best = min(pool, key=lambda i: self._in_flight[i]) if up_now else pool[0]
            self._cursor = (best + 1) % count
            self._in_flight[best] += 1
            self._served[best] += 1
            return best

    def _done(self, index: int, exc: BaseException | None) -> bool:
        """Release the slot; True when `exc` means: mark the replica down and try another."""
        with self._lock:
            self._in_flight[index] -= 1
            if exc is not None and refused(exc):
                self._down_until[index] = self.clock() + self.cool_off_s
                return True
            if exc is None:
                self._down_until[index] = 0.0
            return False

    def _release(self, index: int, tried: set[int], exc: BaseException | None) -> bool:
        """Free the replica's slot; True when the request should go to another replica."""
        return self._done(index, exc) and len(tried) < len(self.replicas)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        tried: set[int] = set()
        while True:
            index = self._choose(tried)
            assert index is not None
            tried.add(index)
            try:
                result = await self.replicas[index]._agenerate(
                    messages, stop=stop, run_manager=run_manager, **kwargs
                )
            except BaseException as exc:  # cancellation too: the slot must be freed
                if self._release(index, tried, exc):
                    continue
                raise
            self._done(index, None)
            return result

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        tried: set[int] = set()
        while True:
            index = self._choose(tried)
            assert index is not None
            tried.add(index)
            try:
                result = self.replicas[index]._generate(
                    messages, stop=stop, run_manager=run_manager, **kwargs
                )
            except BaseException as exc:
                if self._release(index, tried, exc):
                    continue
                raise
            self._done(index, None)
            return result


def make_routed_model(
    base_urls: str | Sequence[str],
    model: str | None = None,
    *,
    cool_off_s: float = COOL_OFF_S,
    **kwargs: Any,
) -> VLLMChatOpenAI | RoutedChatModel:
    """One client per replica URL (`make_chat_model(url, model, **kwargs)`), routed.

    `base_urls` is a list or a comma-separated string; one URL gives a plain VLLMChatOpenAI
    (exactly what `make_chat_model` returns). With several, every replica must serve the
    model: `model=None` asks each server and they must agree, a given `model` must be listed
    by each; otherwise a ServerError names what each URL serves (routing across different
    models would silently mix their results).
    """
    urls = [normalize_base_url(url) for url in split_urls(base_urls)]
    if len(urls) == 1:
        return make_chat_model(urls[0], model, **kwargs)
    served = {url: check_endpoint(url) for url in dict.fromkeys(urls)}
    if model is None:
        firsts = [models[0] if models else None for models in served.values()]
        name, agree = firsts[0], len(set(firsts)) == 1
    else:
        name, agree = model, all(model in models for models in served.values())
    if name is None or not agree:
        listing = "; ".join(
            f"{url} serves {models or 'no model'}" for url, models in served.items()
        )
        wanted = f"the same model ({name!r})" if model else "the same model"
        raise ServerError(
            f"the replicas do not all serve {wanted}: {listing}. Every URL in --base-url must "
            "serve the same model; pass --model to pick one they all list"
        )
    return RoutedChatModel(
        replicas=[make_chat_model(url, name, **kwargs) for url in urls], cool_off_s=cool_off_s
    )
