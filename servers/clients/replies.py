"""What a chat server's reply must be before anything reads it, and the words for one that is not.

The lean reply reader (`VLLMChatOpenAI._post_chat`) decodes a reply's body itself, and a
streamed reply's chunks arrive through the SDK one by one: what the SDK's typed parse used to
catch is the project's to say. Each check here names what came back, for `BadReply`'s one line
(servers.clients.errors): the HTTP status, the content type and the first bytes of a body that
is not JSON; JSON cut short; no choices; a choice without a message; logprobs whose count
differs from the tokens the server billed; a body or a stream the connection cut short; a
stream that ended before its last chunk.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from mur.servers.clients.errors import CUT_REPLY_CHECK, BadReply

SNIPPET_BYTES = 60
"""How much of a body that is not JSON the line shows."""

# h11's words (under httpx) when a connection closes inside a body whose length was announced.
_INCOMPLETE_BODY = "without sending complete message body"
_RECEIVED = re.compile(r"received (\d+) bytes, expected (\d+)")


def read_reply(response: Any) -> dict[str, Any]:
    """The chat completion an HTTP response (httpx's, its body read) holds, or BadReply naming
    the request's URL, the status, the content type and what is wrong with the body."""
    url = str(response.request.url)
    head = f"answered HTTP {response.status_code} ({content_type(response)})"
    body: bytes = response.content
    try:
        reply: dict[str, Any] = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReply(url, f"{head} {undecodable(body, exc)}") from exc
    fault = reply_fault(reply)
    if fault is not None:
        raise BadReply(url, f"{head} {fault}")
    return reply


def content_type(response: Any) -> str:
    return str(response.headers.get("content-type") or "no content type")


def undecodable(body: bytes, exc: orjson.JSONDecodeError) -> str:
    """What a body that does not decode is: empty, JSON cut short, or not JSON at all (with
    its first bytes)."""
    if not body.strip():
        return "with an empty body"
    looks_like_json = body.lstrip()[:1] in (b"{", b"[")
    if looks_like_json and exc.doc and exc.pos >= len(exc.doc.rstrip()):
        return f"with JSON cut short after {len(body)} bytes"
    why = f"{exc.msg} at char {exc.pos}; " if looks_like_json else ""
    return f"with a body that is not JSON ({why}{len(body)} bytes: {snippet(body)})"


def snippet(body: bytes) -> str:
    """The first bytes of `body` as one quoted line (newlines and control characters escaped)."""
    text = repr(body[:SNIPPET_BYTES].decode("utf-8", "replace"))
    return text + "..." if len(body) > SNIPPET_BYTES else text


def reply_fault(reply: Any) -> str | None:
    """What keeps a decoded body from being a chat completion the client reads, as the rest of
    a line that begins "answered HTTP 200 (...)"; None when it is one. A choice without token
    logprobs is not a fault here: nodes.llm says what that means to MUR."""
    if not isinstance(reply, dict):
        return f"with JSON that is no chat completion (a JSON {_kind(reply)})"
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        error = reply.get("error")
        if error:
            return f"with an error instead of choices: {_error_text(error)}"
        shown = f'"choices": {_short(choices)}' if "choices" in reply else 'no "choices" field'
        return f"with no choices ({shown})"
    for index, choice in enumerate(choices):
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            return f"with choice {index} without a message ({_short(choice)})"
    return logprob_fault(choices, reply.get("usage"))


def logprob_fault(choices: list[Any], usage: Any) -> str | None:
    """A reply whose token logprobs are not one per completion token it bills (vLLM sends one
    per generated token, EOS and a stop string's tokens included: servers/README.md), or None.
    Without usage, or with a choice that has no logprobs, there is nothing to compare."""
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    counts = [_logprob_count(choice) for choice in choices]
    if not isinstance(tokens, int) or any(count is None for count in counts):
        return None
    given = sum(count for count in counts if count is not None)
    if given == tokens:
        return None
    return (
        f"with {given} token logprobs for {tokens} completion tokens (usage.completion_tokens; "
        "one logprob per generated token was expected)"
    )


def _logprob_count(choice: dict[str, Any]) -> int | None:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return len(content) if isinstance(content, list) else None


def cut_body(url: str, exc: BaseException, chunks: int | None = None) -> BadReply | None:
    """The BadReply for a connection closed inside a body whose length the headers announced,
    or inside a stream (`chunks` read before; the SDK reports either as a connection error, as
    it does a reset), or None when `exc` was not caused by that."""
    cause = exc.__cause__
    while cause is not None and _INCOMPLETE_BODY not in str(cause):
        cause = cause.__cause__
    if cause is None:
        return None
    found = _RECEIVED.search(str(cause))
    closed = f"after {found.group(1)} of its {found.group(2)} bytes" if found else "inside it"
    what = "its reply short" if chunks is None else f"a streamed reply short after {chunks} chunks"
    return BadReply(url, f"cut {what} (the connection closed {closed})", CUT_REPLY_CHECK)


class StreamCheck:
    """Follows one streamed reply: how many chunks came, and whether the last (the one with a
    finish_reason) did; says what went wrong when the stream breaks or ends early."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.chunks = 0
        self.finished = False

    def saw(self, generation_info: dict[str, Any] | None) -> None:
        self.chunks += 1
        self.finished = self.finished or bool((generation_info or {}).get("finish_reason"))

    def ended(self) -> None:
        """The stream ended: BadReply unless its last chunk came."""
        if not self.finished:
            raise BadReply(
                self.url,
                f"ended a streamed reply after {self.chunks} chunks without its last one "
                "(no finish_reason)",
            )

    def cut(self, exc: BaseException) -> BadReply | None:
        """The BadReply for a stream the connection cut (None: `exc` is no such cut)."""
        return cut_body(self.url, exc, self.chunks)

    def not_json(self, exc: json.JSONDecodeError) -> BadReply:
        """The BadReply for a streamed chunk that is not JSON."""
        return BadReply(
            self.url,
            f"sent a streamed chunk that is not JSON after {self.chunks} chunks ({exc.msg}: "
            f"{snippet(exc.doc.encode())})",
        )


def _kind(value: Any) -> str:
    kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _error_text(error: Any) -> str:
    said = error.get("message") if isinstance(error, dict) else None
    return _short(said if isinstance(said, str) else error, 200)


def _short(value: Any, chars: int = 60) -> str:
    """`value` as compact JSON on one line, at most `chars` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 3] + "..."
