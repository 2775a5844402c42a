"""vLLM's chat-completion reply, written in one place for the test doubles that play vLLM
(fake_vllm.py, tests/faulty_server.py), so their shapes cannot drift apart: the fields vLLM
0.32 writes, in its order (test_lean_replies.py holds them against vLLM's own response class),
token logprob entries with their `bytes` and ranked top entries, usage, a stream's SSE chunks.
What a reply says (its tokens, how likely each is) is each double's own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

NULL_MESSAGE_FIELDS = ("refusal", "annotations", "audio", "function_call", "reasoning")
"""A message's fields vLLM writes as null in the replies the doubles play."""


def dumps(value: Any) -> bytes:
    """JSON as Starlette's JSONResponse writes it (vLLM's reply class)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def logprob_entry(
    token: str, logprob: float, others: Sequence[tuple[str, float]], top: int
) -> dict[str, Any]:
    """One generated token's entry: its `top` ranked entries are the token itself, then
    `others` (tokens with their logprobs) as far as they go."""
    ranked = [(token, logprob), *others][:top]
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": p, "bytes": list(t.encode())} for t, p in ranked],
    }


def choice_body(
    index: int,
    text: str,
    entries: list[dict[str, Any]] | None,
    finish_reason: str,
    stop_reason: str | None,
) -> dict[str, Any]:
    """One choice: its text, its tokens' logprob entries (None: no logprobs were sent) and
    why it ended (`stop_reason` None: the model ended the sequence)."""
    return {
        "index": index,
        "message": {"role": "assistant", "content": text, **dict.fromkeys(NULL_MESSAGE_FIELDS)},
        "logprobs": None if entries is None else {"content": entries},
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "routed_experts": None,
    }


def completion_body(choices: list[dict[str, Any]], usage: Any, model: str) -> dict[str, Any]:
    """The whole reply around its choices and usage."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1764633600,  # fixed: the same reply is the same bytes (fake_vllm.py keeps)
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def sse_chunks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole reply (one choice) as vLLM streams it with `continuous_usage_stats`: a role
    chunk, a chunk a token (its logprobs, the usage so far), the finish_reason chunk and a
    usage chunk. Without its last two, it is a stream that ended early."""
    choice, usage = reply["choices"][0], reply["usage"]
    head = {key: reply[key] for key in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    entries = (choice["logprobs"] or {}).get("content") or []
    text = choice["message"]["content"]
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    shown = 0
    for n, entry in enumerate(entries, start=1):
        piece = entry["token"] if text.startswith(entry["token"], shown) else ""
        shown += len(piece)
        delta = {"index": 0, "delta": {"content": piece}, "logprobs": {"content": [entry]}}
        so_far = {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": n}
        chunks.append({**head, "choices": [{**delta, "finish_reason": None}], "usage": so_far})
    last = {"finish_reason": choice["finish_reason"], "stop_reason": choice["stop_reason"]}
    chunks.append({**head, "choices": [{"index": 0, "delta": {"content": ""}, **last}]})
    chunks.append({**head, "choices": [], "usage": usage})
    return chunks


def sse_body(chunks: Sequence[dict[str, Any]], done: bool = True) -> bytes:
    """The chunks as server-sent events, ended by `data: [DONE]` unless `done` is False."""
    events = b"".join(b"data: " + dumps(chunk) + b"\n\n" for chunk in chunks)
    return events + (b"data: [DONE]\n\n" if done else b"")
