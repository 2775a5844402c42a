"""HTTP recording and replay: every chat-completions request a graph run sends, as it went
over the wire, and the bodies that replay it with the same tokens and the same latency."""

from __future__ import annotations

import contextvars
import itertools
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from mur.benchmarks.counters import Counters
from mur.servers.clients.http_pool import pooled_async_http_client

QUESTION: contextvars.ContextVar[int] = contextvars.ContextVar("bench_question", default=-1)
"""The question a request belongs to: the benchmark sets it per question."""
CHAT_PATH = "/chat/completions"


@dataclass(frozen=True)
class RecordedRequest:
    """One chat-completions request the graph sent, as it went over the wire."""

    question: int
    start: float
    end: float
    body: dict[str, Any]
    choice_tokens: tuple[int, ...]
    completion_tokens: int
    prompt_tokens: int
    cache_hits: float | None = None  # measured per request in isolated (sequential) runs
    cache_queries: float | None = None

    @property
    def n(self) -> int:
        return int(self.body.get("n") or 1)


def recorded_request(
    question: int,
    start: float,
    end: float,
    request_body: bytes | str | dict[str, Any],
    response_body: bytes | str | dict[str, Any],
) -> RecordedRequest:
    """Parse one request/response pair of /v1/chat/completions."""
    body = request_body if isinstance(request_body, dict) else json.loads(request_body)
    reply = response_body if isinstance(response_body, dict) else json.loads(response_body)
    usage = reply.get("usage") or {}
    choice_tokens = []
    for choice in reply.get("choices") or []:
        content = (choice.get("logprobs") or {}).get("content")
        choice_tokens.append(len(content) if content is not None else -1)
    completion = int(usage.get("completion_tokens") or 0)
    if choice_tokens and min(choice_tokens) < 0:  # no logprobs: spread the usage evenly
        share = completion // len(choice_tokens)
        choice_tokens = [share] * len(choice_tokens)
    return RecordedRequest(
        question=question,
        start=start,
        end=end,
        body=body,
        choice_tokens=tuple(choice_tokens),
        completion_tokens=completion,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
    )


def plan_waves(requests: Iterable[RecordedRequest]) -> list[list[list[RecordedRequest]]]:
    """Each question's requests as ordered waves of concurrent requests.

    A request joins the current wave when it was sent before any request of that wave had
    answered (so it cannot depend on one: e.g. the verifier judging N candidates at once);
    otherwise it opens the next wave (it may depend on what came back). Questions come in
    index order, the order the runner starts them.
    """
    plan = []
    ordered = sorted(requests, key=lambda r: (r.question, r.start))
    for _, asked in itertools.groupby(ordered, key=lambda r: r.question):
        waves: list[list[RecordedRequest]] = []
        first_answer = math.inf
        for request in asked:
            if waves and request.start < first_answer:
                waves[-1].append(request)
                first_answer = min(first_answer, request.end)
            else:
                waves.append([request])
                first_answer = request.end
        plan.append(waves)
    return plan


def forced_length(request: RecordedRequest) -> int:
    """Tokens per choice that forcing one request can give: the recorded completion tokens
    spread over its n choices (rounded up), at least 1."""
    total = sum(request.choice_tokens) or request.completion_tokens
    return max(1, math.ceil(total / max(request.n, 1)))


def replay_body(
    request: RecordedRequest, salt: str | None, length: int | None = None
) -> dict[str, Any]:
    """The recorded body forced to `length` tokens per choice (default `forced_length`), in
    its own prefix-cache space (`cache_salt`); vLLM ignores stop strings before `min_tokens`."""
    body = dict(request.body)
    length = forced_length(request) if length is None else max(1, length)
    body.pop("max_completion_tokens", None)
    body.pop("stream", None)
    body.update(max_tokens=length, min_tokens=length, ignore_eos=True)
    if salt:
        body["cache_salt"] = salt
    return body


def replay_bodies(request: RecordedRequest, salt: str | None) -> list[dict[str, Any]]:
    """What replays one recorded request with the same tokens AND the same latency: n > 1
    goes as one n = 1 request per choice, each forced to that choice's length (the graph
    waited for the longest; vLLM serves n as n sequences anyway, table 4a)."""
    if request.n == 1 or len(request.choice_tokens) != request.n:
        return [replay_body(request, salt)]
    single = replace(request, body={k: v for k, v in request.body.items() if k != "n"})
    return [replay_body(single, salt, length) for length in request.choice_tokens]


class Recorder:
    """Records every chat-completions request an HTTP client sends, with its reply, exactly
    as it went over the wire; the question comes from `QUESTION`, set per question."""

    def __init__(self, per_request: Callable[[], Awaitable[Counters]] | None = None) -> None:
        self.raw: list[tuple[int, float, float, bytes, bytes, Counters | None, Counters | None]]
        self.raw = []
        self._pending: dict[int, tuple[int, float, bytes, Counters | None]] = {}
        self._per_request = per_request

    def http_client(self) -> Any:
        """The project's async HTTP client (pooled per event loop) with recording hooks."""
        client = pooled_async_http_client()
        client.event_hooks = {"request": [self._on_request], "response": [self._on_response]}
        return client

    async def _on_request(self, request: Any) -> None:
        if not request.url.path.endswith(CHAT_PATH):
            return
        before = await self._per_request() if self._per_request else None
        self._pending[id(request)] = (QUESTION.get(), time.perf_counter(), request.content, before)

    async def _on_response(self, response: Any) -> None:
        entry = self._pending.pop(id(response.request), None)
        if entry is None:
            return
        end = time.perf_counter()
        body = await response.aread()
        after = await self._per_request() if self._per_request else None
        question, start, content, before = entry
        if response.status_code == 200:
            self.raw.append((question, start, end, content, body, before, after))

    def requests(self) -> list[RecordedRequest]:
        out = []
        for question, start, end, content, body, before, after in self.raw:
            request = recorded_request(question, start, end, content, body)
            if before is not None and after is not None:
                delta = after - before
                request = replace(
                    request, cache_hits=delta.cache_hits, cache_queries=delta.cache_queries
                )
            out.append(request)
        return out
