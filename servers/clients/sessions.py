"""Session affinity: every request of one question carries the same `X-Session-ID` header.

Why: MUR re-sends the whole solution so far at every step, so a step is cheap only on the
replica whose prefix cache already holds the previous one. vllm-router's `consistent_hash`
policy sends every request that carries the same `X-Session-ID` to the same replica; without
the header it hashes something that changes from step to step (or nothing at all), and a
question's steps land wherever.

The id travels in a context variable, so graphs/ and nodes/ stay unaware of it: whoever runs
one question wraps the run in `session(...)` (the benchmark runner, run.py, the MUR endpoint),
and every `VLLMChatOpenAI` request made inside (backbone and verifier alike) sends the header.
Inside a LangGraph run without one (e.g. LangGraph Studio), the run's thread id is used. A
single vLLM server ignores the header.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from langchain_core.runnables import ensure_config

SESSION_HEADER = "X-Session-ID"
MAX_SESSION_ID = 200
"""Characters kept of a session id (HTTP header values have practical length limits)."""

_current: ContextVar[str | None] = ContextVar("mur_session_id", default=None)
_NOT_TOKEN = re.compile(r"[^\x21-\x7e]")  # header values: visible ASCII only


def clean_session_id(value: str) -> str:
    """A header-safe form of `value`: visible ASCII (others become `_`), at most 200 chars."""
    cleaned = _NOT_TOKEN.sub("_", str(value).strip())[:MAX_SESSION_ID]
    if not cleaned:
        raise ValueError("a session id must not be empty")
    return cleaned


def new_session_id(*parts: object) -> str:
    """`part1/part2/...` (e.g. run id and question id), or a fresh random id without parts."""
    text = "/".join(str(part) for part in parts if str(part)) or uuid.uuid4().hex
    return clean_session_id(text)


@contextmanager
def session(session_id: str) -> Iterator[str]:
    """Send `X-Session-ID: session_id` with every model request made inside this block.

    The context variable is copied into the asyncio tasks LangGraph creates for the run, so
    concurrent questions, each in its own task with its own `session`, never mix.
    """
    token = _current.set(clean_session_id(session_id))
    try:
        yield _current.get() or session_id
    finally:
        _current.reset(token)


def current_session_id() -> str | None:
    """The id set by `session`, else the thread id of the LangGraph run in progress."""
    value = _current.get()
    if value:
        return value
    # ensure_config: LangChain's public read of the config of the run in progress, if any.
    thread = (ensure_config().get("configurable") or {}).get("thread_id")
    return clean_session_id(str(thread)) if thread else None


def session_headers() -> dict[str, str]:
    """`{"X-Session-ID": id}` for the current session, or `{}` outside any."""
    value = current_session_id()
    return {SESSION_HEADER: value} if value else {}
