"""What a failed request to an OpenAI-compatible server means for the run that made it.

The client layer's knowledge of its own exceptions (the openai SDK's, httpx's, BadReply for a
reply that is no chat completion) and of vLLM's wording, in one place. The graph receives these
verdicts as LangGraph receives `retry_on`: `is_transient` decides which model calls are
retried, `context_overflow` which failures end a solution instead of failing it, and
`describe_transport_error` words the one line the CLI, the endpoint and the evaluation runner
give for a failed run. Nodes never see these types: they make requests through any LangChain
chat model and let its exceptions pass.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx

from mur.servers.clients.errors import BadReply


@dataclass(frozen=True)
class ContextOverflow:
    """A request that does not fit the model's context (the server answered HTTP 400).

    `room` is how many tokens the server could still have generated after this prompt, when
    its message says (vLLM states the prompt's size when prompt + max_tokens is too long); None
    when unknown or when the prompt alone is too long.
    """

    message: str
    max_context: int | None
    prompt_tokens: int | None

    @property
    def room(self) -> int | None:
        if self.max_context is None or self.prompt_tokens is None:
            return None
        return max(self.max_context - self.prompt_tokens, 0)

    def __str__(self) -> str:
        return self.message


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


def _openai() -> ModuleType | None:
    """The openai SDK when something has loaded it, else None.

    An exception of the SDK's means the SDK is loaded; importing it here would cost seconds
    to every graph that runs on another client (a test's fake, a local model).
    """
    return sys.modules.get("openai")


def context_overflow(exc: BaseException) -> ContextOverflow | None:
    """The overflow an HTTP 400 describes, or None when `exc` is something else."""
    openai = _openai()
    if openai is None or not isinstance(exc, openai.BadRequestError):
        return None
    message = str(getattr(exc, "message", "") or exc)
    found = _MAX_CONTEXT.search(message)
    if found is None:
        return None
    prompt = _PROMPT_TOKENS.search(message)
    prompt_tokens = next((int(g) for g in prompt.groups() if g), None) if prompt else None
    return ContextOverflow(message, int(found.group(1)), prompt_tokens)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the server was unreachable, slow, overloaded or failed (5xx), or its
    reply was no chat completion (BadReply: a gateway's error page, a body cut short; the next
    attempt may reach the server itself).

    A 4xx answer (bad request, context overflow, unknown model) or a reply without logprobs
    will fail again the same way: those stop the question at once, with their own message.
    """
    if isinstance(exc, BadReply):
        return True
    openai = _openai()
    if openai is not None:
        if isinstance(exc, openai.APIConnectionError | openai.RateLimitError):
            return True  # includes timeouts
        if isinstance(exc, openai.APIStatusError):
            return exc.status_code >= 500
    if isinstance(exc, httpx.TransportError | ConnectionError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    return False


def describe_transport_error(
    exc: BaseException,
    attempts: int,
    roles: Mapping[str, str] | None = None,
    hint: str | None = None,
) -> str | None:
    """One line for the client error behind `exc` (None: there is none): the server named by
    its role (`roles`: base URL -> "backbone" / "verifier") or its URL, what it did or what
    came back, after how many `attempts`, and what to check (`hint` for an unreachable one)."""
    sdk = _openai()
    error = _client_error(exc, sdk)
    if isinstance(error, BadReply):
        return error.said_of(_who(error.url, roles), attempts)
    if sdk is None or error is None:
        return None
    request = getattr(error, "request", None)
    who = _who(str(request.url) if request is not None else "?", roles)
    if isinstance(error, sdk.APITimeoutError):
        return (
            f"{who} did not answer in time, {attempts} attempts: is it stalled or overloaded? "
            "For a slow server raise MUR_TIMEOUT_PER_TOKEN_S (seconds allowed per requested "
            "token, default 1)"
        )
    if isinstance(error, sdk.APIConnectionError):
        check = hint or "is it still running there?"
        return f"{who} is unreachable ({error}), {attempts} attempts: {check}"
    if isinstance(error, sdk.APIStatusError):
        body = error.body if isinstance(error.body, dict) else {}
        said = body.get("message") or error.message  # the server's words, not the SDK's
        code = error.status_code
        if code >= 500:
            return f"{who} failed the request (HTTP {code}), {attempts} attempts: {said}"
        return f"{who} refused a request (HTTP {code}): {said}"
    return f"{who} answered an error: {error}"


def _who(url: str, roles: Mapping[str, str] | None) -> str:
    """The server that `url` (a request's) went to: "the backbone at <base URL>" by its role,
    else "the model server at <url>"."""
    return next(
        (f"the {role} at {base}" for base, role in (roles or {}).items() if url.startswith(base)),
        f"the model server at {url}",
    )


def _client_error(exc: BaseException, sdk: ModuleType | None) -> Any:
    """The client's error behind `exc` (itself, or what it was raised from): a BadReply, or
    the SDK's; None when there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, BadReply) or (sdk is not None and isinstance(current, sdk.APIError)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
