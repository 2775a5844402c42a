"""A vLLM-shaped server that answers at once, for measuring the client's own cost.

    python -m mur.cli.fakes vllm [--port 8061] [--steps 8]

On a GPU the engine answers a hundred times faster than the 2-core CPU server, and the client
(the graph, LangChain, the SDK, the checkpointer) may become the bottleneck. To see the
client alone this server spends no time generating: every reply is built once, as vLLM 0.32
would write it (vllm_replies.py: the same fields in the same order, `stop_reason`, token
logprobs with their `bytes` and as many top entries as asked), and then sent as stored bytes.
It runs in its own process, so its CPU is measured apart from the client's.

What it answers (a MUR solution of `--steps` steps, whatever the question):
- a backbone step (the last message an assistant prefix ending `StepK:`): step K, 64-100
  tokens, ended by the stop string `\\nStep`; step `--steps` states `\\boxed{42}` and ends
  the sequence (EOS). A critic's revision (the request holds its feedback) is marked
  `(revised)`. `n` choices are the same step n times;
- a judge's prompt (`You are a teacher`): a verdict on its paragraph, `\\boxed{No}` for one
  not yet revised, else `\\boxed{Yes}`: a critic revises every step it scales;
- the answer fallback (a prefix ending `Therefore, the answer is`): ` \\boxed{42}.`.
Each step's token logprobs have their own mean, so the gamma-gate scales some steps.

`GET /metrics` keeps vLLM's counters (`vllm:generation_tokens_total`, `vllm:prompt_tokens_total`,
`vllm:request_success_total`), so a client's token count can be checked against the server's;
`/v1/models`, `/version` and `/health` answer as vLLM's do. Streaming is not served (a request
with `stream: true` gets 400).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from mur.testing.vllm_replies import choice_body, completion_body, dumps, logprob_entry, usage_of

MODEL = "fake/vllm"
VERSION = "0.32.0"
ANSWER = "42"
STEP_TOKENS = (72, 96, 64, 88, 80, 100, 68, 84)
"""Generated tokens of step 1, 2, ... (then again from the start)."""
STEP_UNCERTAINTY = (0.05, 0.04, 0.60, 0.05, 0.06, 0.70, 0.05, 0.04)
"""Mean negative logprob of step 1, 2, ...: steps 3 and 6 stand out of the momentum, so MUR's
gate (gamma 0.9) scales those two of eight."""
WORDS = (" we", " find", " the", " value", " of", " x", " so", " that", " it", " holds", ",")
ALTERNATIVES = (" a", " an", " this", " one", " its", " then", " and", " for", " is", " to")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _entry(token: str, logprob: float, top: int, rank: int) -> dict[str, Any]:
    """One token's logprob entry: under it, alternatives half a nat apart each."""
    others = []
    for i in range(1, top):
        other = ALTERNATIVES[(rank + i) % len(ALTERNATIVES)] + ("" if i < 10 else str(i))
        others.append((other, round(logprob - 0.5 * i, 6)))
    return logprob_entry(token, logprob, others, top)


@dataclass(frozen=True)
class Choice:
    """One reply choice: its tokens, their logprobs and how it ended."""

    tokens: tuple[str, ...]
    logprobs: tuple[float, ...]
    stop_reason: str | None  # None: the model ended the sequence

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def step_choice(index: int, steps: int, revised: bool) -> Choice:
    """Step `index` of a solution of `steps` steps (1-based)."""
    slot = (index - 1) % len(STEP_TOKENS)
    count, mean = STEP_TOKENS[slot], STEP_UNCERTAINTY[slot]
    head = [" (revised)"] if revised else []
    if index >= steps:
        tail = [" the", " answer", " is", " \\", "boxed", "{", ANSWER, "}", "."]
    else:
        tail = ["."]
    body = [WORDS[i % len(WORDS)] for i in range(count - len(head) - len(tail))]
    tokens = (*head, *body, *tail)
    # Around the mean, alternately above and below it: the step's mean stays `mean`.
    logprobs = tuple(round(-mean + (0.02 if i % 2 else -0.02), 6) for i in range(len(tokens)))
    if len(tokens) % 2:
        logprobs = (*logprobs[:-1], -mean)
    return Choice(tokens, logprobs, None if index >= steps else "\nStep")


def verdict_choice(correct: bool) -> Choice:
    """A judge's verdict on a paragraph."""
    word = "Yes" if correct else "No"
    judged = " correct" if correct else " wrong"
    tokens = (" The", " paragraph", " is", judged, ".", " \\", "boxed", "{", word, "}")
    return Choice(tokens, tuple(-0.05 for _ in tokens), None)


FALLBACK = Choice((" \\", "boxed", "{", ANSWER, "}", "."), (-0.1,) * 6, None)


_USAGE = "@usage@"


def reply_body(choices: list[Choice], top: int, prompt_tokens: int) -> bytes:
    """The JSON vLLM 0.32 sends for these choices (`logprobs=true`, `top` top entries)."""
    completion = sum(len(choice.tokens) for choice in choices)
    before, after = reply_parts(choices, top)
    return before + dumps(usage_of(prompt_tokens, completion)) + after


def reply_parts(choices: list[Choice], top: int) -> tuple[bytes, bytes]:
    """The reply's bytes before and after its usage, which is all that differs between two
    requests answered with the same choices."""
    bodies = []
    for i, choice in enumerate(choices):
        pairs = enumerate(zip(choice.tokens, choice.logprobs, strict=True))
        entries = [_entry(token, logprob, top, rank) for rank, (token, logprob) in pairs]
        bodies.append(choice_body(i, choice.text, entries, "stop", choice.stop_reason))
    before, after = dumps(completion_body(bodies, _USAGE, MODEL)).split(dumps(_USAGE))
    return before, after


_STEP_PREFIX = re.compile(r"Step(\d+):$")


def answer_of(request: dict[str, Any], steps: int) -> list[Choice]:
    """The choices to answer `request` with (see the module docstring)."""
    messages = request.get("messages") or []
    last = str(messages[-1].get("content") or "") if messages else ""
    n = int(request.get("n") or 1)
    if messages and messages[0].get("role") == "user" and "You are a teacher" in last:
        paragraph = last[last.rfind("<paragraph_") :]
        return [verdict_choice("(revised)" in paragraph)] * n
    if last.endswith("Therefore, the answer is"):
        return [FALLBACK] * n
    found = _STEP_PREFIX.search(last)
    index = int(found.group(1)) if found else 1
    revised = any("previous solution is incorrect" in str(m.get("content")) for m in messages)
    return [step_choice(index, steps, revised)] * n


@dataclass
class Counters:
    """vLLM's Prometheus counters, as a client checks its own count against them."""

    generation_tokens: int = 0
    prompt_tokens: int = 0
    requests: int = 0

    def exposition(self) -> bytes:
        lines = [
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{model_name="{MODEL}"}} {self.generation_tokens}.0',
            "# TYPE vllm:prompt_tokens_total counter",
            f'vllm:prompt_tokens_total{{model_name="{MODEL}"}} {self.prompt_tokens}.0',
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{finished_reason="stop",model_name="{MODEL}"}} '
            f"{self.requests}.0",
        ]
        return ("\n".join(lines) + "\n").encode()


@dataclass
class FakeVLLM:
    """The ASGI app: replies built once per kind (step, n, top) and kept as bytes."""

    steps: int = 8
    counters: Counters = field(default_factory=Counters)
    _built: dict[tuple[Any, ...], tuple[bytes, bytes, int]] = field(default_factory=dict)

    def reply(self, request: dict[str, Any], prompt_tokens: int) -> tuple[bytes, int]:
        """The reply's bytes and its generated tokens."""
        choices = answer_of(request, self.steps)
        top = int(request.get("top_logprobs") or 0) if request.get("logprobs") else 0
        key = (tuple(choices), top)
        if key not in self._built:
            tokens = sum(len(choice.tokens) for choice in choices)
            self._built[key] = (*reply_parts(choices, top), tokens)
        before, after, tokens = self._built[key]
        return before + dumps(usage_of(prompt_tokens, tokens)) + after, tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method == "POST" and path == "/v1/chat/completions":
            await self._chat(receive, send)
        elif method == "GET" and path == "/v1/models":
            await _send(send, 200, _MODELS)
        elif method == "GET" and path == "/version":
            await _send(send, 200, orjson.dumps({"version": VERSION}))
        elif method == "GET" and path == "/health":
            await _send(send, 200, b"")
        elif method == "GET" and path == "/metrics":
            await _send(send, 200, self.counters.exposition(), b"text/plain; version=0.0.4")
        else:
            await _send(send, 404, orjson.dumps({"error": {"message": f"no route {path}"}}))

    async def _chat(self, receive: Receive, send: Send) -> None:
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = orjson.loads(raw)
        if request.get("stream"):
            error = {"error": {"message": "this fake server does not stream", "code": 400}}
            await _send(send, 400, orjson.dumps(error))
            return
        # A tokenizer's count would cost the server time; a quarter of the bytes is near it.
        prompt_tokens = len(raw) // 4
        body, tokens = self.reply(request, prompt_tokens)
        self.counters.generation_tokens += tokens
        self.counters.prompt_tokens += prompt_tokens
        self.counters.requests += 1
        await _send(send, 200, body)


_MODELS = orjson.dumps(
    {
        "object": "list",
        "data": [
            {
                "id": MODEL,
                "object": "model",
                "created": 1764633600,
                "owned_by": "vllm",
                "root": MODEL,
                "parent": None,
                "max_model_len": 32768,
            }
        ],
    }
)


async def _send(send: Send, status: int, body: bytes, kind: bytes = b"application/json") -> None:
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
