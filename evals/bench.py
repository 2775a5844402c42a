"""`python -m evals.bench`: MUR's token economy and the orchestration's speed, side by side.

One command, one vLLM server, the same MATH-500 questions, four tables written to
BENCHMARKS.md:

1. Token economy: every strategy under the gates `mur`, `always` (Per-Step Scale) and `never`
   (Vanilla CoT): tokens (backbone + external), calls, scaled / total steps, wall time, and the
   ratios MUR / always and MUR / never. Goal (the paper's claim): MUR <= 0.55x always.
2. Orchestration overhead: the graph's wall time against replaying the exact requests it made
   (recorded on the wire, question by question, concurrent requests kept concurrent) with the
   plain async OpenAI client at the same concurrency, every reply forced to its recorded length
   (`min_tokens` = `max_tokens`, `ignore_eos`). Goal: graph / replay <= 1.05.
3. Concurrency scaling: tokens/s of whole graph runs at 1, 2, 4, 8, 16 questions in flight
   against the server's raw batched throughput at the same concurrency (the same request
   bodies with their recorded lengths, no dependencies between them). Goal: >= 0.8 at 8+.
4. Request efficiency: n candidates in one request vs n requests, the prefix-cache hit rate
   during MUR runs, and the prompt tokens each step re-sends and recomputes.

The machine is shared and noisy, so every number that matters is a ratio of two measurements
taken side by side in the same run. Token counts come from the graph's own accounting and are
checked against the server's Prometheus counters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import datetime as dt
import json
import math
import os
import platform
import secrets
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from servers.metrics import parse_counter

# ------------------------------------------------------------------------------ constants

DEFAULT_STRATEGIES: tuple[str, ...] = ("best_of_n", "critic")
DEFAULT_GATES: tuple[str, ...] = ("mur", "always", "never")
DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16)
# Small graph settings, so the whole benchmark runs in minutes on a 2-core CPU server.
SMALL_SETTINGS: dict[str, int] = {
    "max_steps": 6,
    "max_step_tokens": 96,
    "judge_max_tokens": 64,
    "thinking_budget": 64,
}
GOAL_TOKENS = 0.55  # MUR total tokens / Per-Step Scale's
GOAL_OVERHEAD = 1.05  # graph wall time / direct replay's
GOAL_SCALING = 0.8  # graph tokens/s / raw batched tokens/s, at GOAL_SCALING_FROM and above
GOAL_SCALING_FROM = 8
NOTES_MARKER = "<!-- notes: everything below this line is kept when evals.bench rewrites the file -->"

# vLLM's Prometheus counters the benchmark reads (sums over label sets).
COUNTERS: dict[str, str] = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "cache_queries": "vllm:prefix_cache_queries_total",
    "cache_hits": "vllm:prefix_cache_hits_total",
    "step_tokens": "vllm:iteration_tokens_total_sum",
    "steps": "vllm:iteration_tokens_total_count",
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
}


# ----------------------------------------------------------------------- pure helpers


@dataclass(frozen=True)
class Counters:
    """A snapshot (or a difference of two) of the server's counters; None = not exposed."""

    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    cache_queries: float | None = None
    cache_hits: float | None = None
    step_tokens: float | None = None
    steps: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None

    def __sub__(self, other: Counters) -> Counters:
        values = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            values[f.name] = None if a is None or b is None else a - b
        return Counters(**values)

    @property
    def hit_rate(self) -> float | None:
        """Prefix-cache hits / queries (tokens)."""
        return ratio(self.cache_hits, self.cache_queries)

    @property
    def tokens_per_step(self) -> float | None:
        """Mean tokens per engine step (prefill + decode): how full the batch was."""
        return ratio(self.step_tokens, self.steps)


def parse_counters(text: str) -> Counters:
    """The counters of `COUNTERS` from a Prometheus /metrics text."""
    return Counters(**{key: parse_counter(text, name) for key, name in COUNTERS.items()})


def parse_block_size(text: str) -> int | None:
    """The KV-cache block size from vLLM's `cache_config_info` (prefix hits are whole blocks)."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            for part in line.split("{", 1)[1].rsplit("}", 1)[0].split(","):
                key, _, value = part.partition("=")
                if key.strip() == "block_size":
                    with contextlib.suppress(ValueError):
                        return int(value.strip().strip('"'))
    return None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def fmt(value: float | int | None, digits: int = 1) -> str:
    """A table cell: thousands separators, fixed digits, '-' for missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table; cells are str()-ed, pipes escaped."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    lines.extend("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)
    return "\n".join(lines)


def verdict(value: float | None, goal: float, *, at_most: bool) -> str:
    """'met' / 'missed' for a ratio against its goal."""
    if value is None:
        return "not measured"
    ok = value <= goal if at_most else value >= goal
    return "met" if ok else "missed"


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
    by_question: dict[int, list[RecordedRequest]] = {}
    for request in requests:
        by_question.setdefault(request.question, []).append(request)
    plan = []
    for question in sorted(by_question):
        waves: list[list[RecordedRequest]] = []
        first_answer = math.inf
        for request in sorted(by_question[question], key=lambda r: r.start):
            if waves and request.start < first_answer:
                waves[-1].append(request)
                first_answer = min(first_answer, request.end)
            else:
                waves.append([request])
                first_answer = request.end
        plan.append(waves)
    return plan


def forced_length(request: RecordedRequest) -> int:
    """Tokens per choice that a replay forces: the recorded completion tokens spread over the
    n choices (rounded up), at least 1. Totals match the graph's within n - 1 tokens."""
    total = sum(request.choice_tokens) or request.completion_tokens
    return max(1, math.ceil(total / max(request.n, 1)))


def replay_body(request: RecordedRequest, salt: str | None) -> dict[str, Any]:
    """The recorded body, every choice forced to its recorded length, in its own cache space.

    Messages, n, logprobs, stop strings and sampling stay as sent (vLLM ignores stop strings
    before `min_tokens`); `cache_salt` keeps the replay from reusing the graph's cached prefixes.
    """
    body = dict(request.body)
    length = forced_length(request)
    body.pop("max_completion_tokens", None)
    body.pop("stream", None)
    body.update(max_tokens=length, min_tokens=length, ignore_eos=True)
    if salt:
        body["cache_salt"] = salt
    return body


def step_of(body: dict[str, Any]) -> int | None:
    """The step index a draft request continues (`...StepT:` as the last assistant message),
    or None for any other request (judges, candidates with n > 1, revisions, fallbacks)."""
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "assistant" or int(body.get("n") or 1) != 1:
        return None
    if any(m.get("role") == "user" for m in messages[-2:-1]) and len(messages) > 2:
        return None  # the critic's revision turn
    content = str(messages[-1].get("content") or "")
    tail = content.rsplit("Step", 1)
    if len(tail) != 2 or not tail[1].endswith(":") or not tail[1][:-1].isdigit():
        return None
    return int(tail[1][:-1])


@dataclass(frozen=True)
class StepPromptRow:
    step: int
    requests: int
    prompt_tokens: float
    growth: float | None
    cache_hits: float | None
    recomputed: float | None


def step_prompt_rows(requests: Sequence[RecordedRequest]) -> list[StepPromptRow]:
    """Per step index: mean prompt tokens of the draft requests, their growth over the same
    question's previous draft (the new text the server has never seen), the cached tokens and
    the tokens recomputed (prompt - cached)."""
    drafts: dict[int, dict[int, RecordedRequest]] = {}
    for request in requests:
        step = step_of(request.body)
        if step is not None:
            drafts.setdefault(step, {})[request.question] = request
    rows = []
    for step in sorted(drafts):
        group = drafts[step]
        prompts = [r.prompt_tokens for r in group.values()]
        growths = [
            r.prompt_tokens - drafts[step - 1][q].prompt_tokens
            for q, r in group.items()
            if step - 1 in drafts and q in drafts[step - 1]
        ]
        hits = [r.cache_hits for r in group.values() if r.cache_hits is not None]
        recomputed = [
            r.prompt_tokens - r.cache_hits for r in group.values() if r.cache_hits is not None
        ]
        rows.append(
            StepPromptRow(
                step=step,
                requests=len(group),
                prompt_tokens=sum(prompts) / len(prompts),
                growth=sum(growths) / len(growths) if growths else None,
                cache_hits=sum(hits) / len(hits) if hits else None,
                recomputed=sum(recomputed) / len(recomputed) if recomputed else None,
            )
        )
    return rows


def rate_between(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Counter increase per second between t0 and t1, linearly interpolated from (t, value)
    samples; None when the window is empty or not covered."""
    if t1 <= t0 or len(samples) < 2 or samples[0][0] > t0 or samples[-1][0] < t1:
        return None

    def value_at(t: float) -> float:
        for (ta, va), (tb, vb) in zip(samples, samples[1:], strict=False):
            if ta <= t <= tb:
                return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)
        return samples[-1][1]

    return (value_at(t1) - value_at(t0)) / (t1 - t0)


def merge_notes(generated: str, previous: str | None) -> str:
    """The new generated text plus whatever the previous file held below `NOTES_MARKER`."""
    notes = ""
    if previous and NOTES_MARKER in previous:
        notes = previous.split(NOTES_MARKER, 1)[1].strip("\n")
    text = generated.rstrip("\n") + f"\n\n{NOTES_MARKER}\n"
    return text + (f"\n{notes}\n" if notes else "")


# ---------------------------------------------------------------------- result records


@dataclass
class GraphRun:
    """One graph run over a set of questions, with what it cost and what it sent."""

    label: str
    strategy: str
    gate: str
    concurrency: int
    questions: int
    wall_s: float = 0.0
    cpu_s: float = 0.0
    server: Counters = field(default_factory=Counters)
    backbone_tokens: int = 0
    external_tokens: int = 0
    calls: int = 0
    steps_total: int = 0
    steps_scaled: int = 0
    scaled_by_step: dict[int, tuple[int, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    requests: list[RecordedRequest] = field(default_factory=list)
    samples: list[tuple[float, float]] = field(default_factory=list)
    start: float = 0.0
    last_question_start: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.backbone_tokens + self.external_tokens

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens per second of the whole run (the server's count)."""
        return ratio(self.server.generation_tokens, self.wall_s)

    @property
    def steady_tokens_per_s(self) -> float | None:
        """Tokens/s while every slot had a question (until the last question started)."""
        if self.questions <= self.concurrency:
            return None
        return rate_between(self.samples, self.start, self.last_question_start)


@dataclass
class ReplayRun:
    label: str
    wall_s: float
    cpu_s: float
    server: Counters
    requests: int


@dataclass
class RawRun:
    concurrency: int
    seconds: float
    server: Counters
    requests_done: int

    @property
    def tokens_per_s(self) -> float | None:
        return ratio(self.server.generation_tokens, self.seconds)


@dataclass
class NChoiceRun:
    label: str
    wall_s: float
    server: Counters


# ----------------------------------------------------------------- tables (pure, tested)


def economy_table(runs: Sequence[GraphRun]) -> tuple[str, list[str]]:
    """Table 1 and one goal line per strategy."""
    by_key = {(r.strategy, r.gate): r for r in runs}
    rows = []
    for r in runs:
        always, never = by_key.get((r.strategy, "always")), by_key.get((r.strategy, "never"))
        rows.append(
            [
                r.strategy,
                r.gate,
                r.questions,
                fmt(r.backbone_tokens),
                fmt(r.external_tokens),
                fmt(r.total_tokens),
                fmt(int(r.server.generation_tokens or 0)),
                fmt(r.calls),
                f"{r.steps_scaled} / {r.steps_total}",
                fmt(r.wall_s),
                fmt_ratio(ratio(r.total_tokens, always.total_tokens if always else None)),
                fmt_ratio(ratio(r.total_tokens, never.total_tokens if never else None)),
            ]
        )
    table = markdown_table(
        [
            "strategy",
            "gate",
            "questions",
            "backbone tok",
            "external tok",
            "total tok",
            "server tok",
            "calls",
            "scaled / steps",
            "wall s",
            "tok vs always",
            "tok vs never",
        ],
        rows,
    )
    goals = []
    for strategy in dict.fromkeys(r.strategy for r in runs):
        mur, always, never = (by_key.get((strategy, g)) for g in ("mur", "always", "never"))
        if not (mur and always):
            continue
        tok = ratio(mur.total_tokens, always.total_tokens)
        goals.append(
            f"- {strategy}: MUR / always = {fmt_ratio(tok)} tokens "
            f"({fmt_ratio(ratio(mur.calls, always.calls))} calls, "
            f"{fmt_ratio(ratio(mur.wall_s, always.wall_s))} wall); MUR / never = "
            f"{fmt_ratio(ratio(mur.total_tokens, never.total_tokens if never else None))} "
            f"tokens. Goal <= {GOAL_TOKENS:.2f}x: **{verdict(tok, GOAL_TOKENS, at_most=True)}**"
            f" (MUR scaled {mur.steps_scaled} of {mur.steps_total} steps; by step index "
            + ", ".join(
                f"t={t}: {s}/{n}" for t, (s, n) in sorted(mur.scaled_by_step.items())
            )
            + ")"
        )
    return table, goals


def overhead_table(pairs: Sequence[tuple[GraphRun, ReplayRun]]) -> tuple[str, list[str]]:
    """Table 2 and its goal lines."""
    rows, goals = [], []
    for graph, replay in pairs:
        r = ratio(graph.wall_s, replay.wall_s)
        rows.append(
            [
                graph.label,
                graph.questions,
                graph.concurrency,
                replay.requests,
                fmt(graph.wall_s, 2),
                fmt(replay.wall_s, 2),
                fmt_ratio(r),
                fmt(int(graph.server.generation_tokens or 0)),
                fmt(int(replay.server.generation_tokens or 0)),
                fmt(graph.cpu_s, 2),
                fmt(replay.cpu_s, 2),
                fmt(ratio(1000 * (graph.cpu_s - replay.cpu_s), replay.requests), 2),
            ]
        )
        goals.append(
            f"- {graph.label}: graph / replay = {fmt_ratio(r)}. Goal <= {GOAL_OVERHEAD:.2f}x: "
            f"**{verdict(r, GOAL_OVERHEAD, at_most=True)}**"
        )
    table = markdown_table(
        [
            "run",
            "questions",
            "concurrency",
            "requests",
            "graph wall s",
            "replay wall s",
            "graph / replay",
            "graph server tok",
            "replay server tok",
            "graph client CPU s",
            "replay client CPU s",
            "extra client CPU ms / request",
        ],
        rows,
    )
    return table, goals


def scaling_table(pairs: Sequence[tuple[GraphRun, RawRun]]) -> tuple[str, list[str]]:
    """Table 3 and its goal lines (levels at and above GOAL_SCALING_FROM)."""
    rows, goals = [], []
    for graph, raw in pairs:
        r = ratio(graph.tokens_per_s, raw.tokens_per_s)
        steady = ratio(graph.steady_tokens_per_s, raw.tokens_per_s)
        rows.append(
            [
                graph.concurrency,
                graph.questions,
                fmt(graph.wall_s),
                fmt(graph.tokens_per_s),
                fmt(raw.tokens_per_s),
                fmt_ratio(r),
                fmt_ratio(steady),
                fmt(graph.server.tokens_per_step),
                fmt(raw.server.tokens_per_step),
                fmt(100 * graph.cpu_s / graph.wall_s if graph.wall_s else None, 0),
            ]
        )
        if graph.concurrency >= GOAL_SCALING_FROM:
            goals.append(
                f"- {graph.concurrency} in flight: graph / raw = {fmt_ratio(r)} (steady window "
                f"{fmt_ratio(steady)}). Goal >= {GOAL_SCALING:.2f}x: "
                f"**{verdict(r, GOAL_SCALING, at_most=False)}**"
            )
    table = markdown_table(
        [
            "concurrency",
            "questions",
            "graph wall s",
            "graph tok/s",
            "raw tok/s",
            "graph / raw",
            "steady graph / raw",
            "graph tok / engine step",
            "raw tok / engine step",
            "client CPU % of a core",
        ],
        rows,
    )
    return table, goals


def n_choice_table(runs: Sequence[NChoiceRun]) -> str:
    """Table 4a: candidates in one request (n) vs n separate requests."""
    rows = []
    for run in runs:
        s = run.server
        computed = None
        if s.cache_queries is not None and s.cache_hits is not None:
            computed = s.cache_queries - s.cache_hits
        rows.append(
            [
                run.label,
                fmt(run.wall_s, 2),
                fmt(int(s.generation_tokens or 0)),
                fmt(int(s.prompt_tokens or 0)),
                fmt(int(s.cache_hits or 0)),
                fmt(int(computed) if computed is not None else None),
            ]
        )
    return markdown_table(
        [
            "candidates as",
            "wall s",
            "generated tok",
            "prompt tok",
            "prefix-cache hit tok",
            "prompt tok computed",
        ],
        rows,
    )


def cache_table(runs: Sequence[GraphRun], block_size: int | None) -> str:
    """Table 4b: prefix-cache hit rate during graph runs."""
    rows = [
        [
            r.label,
            fmt(int(r.server.prompt_tokens or 0)),
            fmt(int(r.server.cache_queries or 0)),
            fmt(int(r.server.cache_hits or 0)),
            fmt(100 * r.server.hit_rate if r.server.hit_rate is not None else None),
            fmt(block_size),
        ]
        for r in runs
    ]
    return markdown_table(
        ["run", "prompt tok", "cache queries tok", "cache hits tok", "hit rate %", "block size"],
        rows,
    )


def step_table(rows: Sequence[StepPromptRow]) -> str:
    """Table 4c: prompt tokens each step re-sends and recomputes."""
    return markdown_table(
        [
            "step",
            "drafts",
            "prompt tok sent",
            "new since previous step",
            "prefix-cache hit tok",
            "recomputed tok",
            "recomputed / new",
        ],
        [
            [
                r.step,
                r.requests,
                fmt(r.prompt_tokens),
                fmt(r.growth),
                fmt(r.cache_hits),
                fmt(r.recomputed),
                fmt_ratio(ratio(r.recomputed, r.growth)),
            ]
            for r in rows
        ],
    )


# ---------------------------------------------------------------------- server access

_QUESTION: contextvars.ContextVar[int] = contextvars.ContextVar("bench_question", default=-1)
CHAT_PATH = "/chat/completions"


class Server:
    """The vLLM server under test: its root, model and counters."""

    def __init__(self, base_url: str, model: str) -> None:
        import httpx

        from servers.launcher import normalize_base_url, root_url

        self.base_url = normalize_base_url(base_url)
        self.root = root_url(self.base_url)
        self.model = model
        self._http = httpx.AsyncClient(timeout=10)

    async def metrics_text(self) -> str:
        resp = await self._http.get(f"{self.root}/metrics")
        resp.raise_for_status()
        return resp.text

    async def counters(self) -> Counters:
        return parse_counters(await self.metrics_text())

    async def version(self) -> str:
        """vLLM's version (GET /version), or '?'."""
        with contextlib.suppress(Exception):
            resp = await self._http.get(f"{self.root}/version")
            return str(resp.json().get("version", "?"))
        return "?"

    async def idle(self, timeout: float = 60) -> None:
        """Wait until the server runs no request (aborted ones drain asynchronously)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c = await self.counters()
            if not c.requests_running and not c.requests_waiting:
                return
            await asyncio.sleep(0.2)

    async def aclose(self) -> None:
        await self._http.aclose()


class Recorder:
    """Records every chat-completions request an HTTP client sends, with its reply.

    Hooks at the HTTP level, so what is recorded is exactly what went over the wire; the
    question index comes from a context variable the runner sets per question.
    """

    def __init__(self, per_request: Callable[[], Awaitable[Counters]] | None = None) -> None:
        self.raw: list[tuple[int, float, float, bytes, bytes, Counters | None, Counters | None]]
        self.raw = []
        self._pending: dict[int, tuple[int, float, bytes, Counters | None]] = {}
        self._per_request = per_request

    def http_client(self) -> Any:
        """The project's async HTTP client (no idle connections) with recording hooks."""
        from servers.clients import loop_safe_async_http_client

        client = loop_safe_async_http_client()
        client.event_hooks = {"request": [self._on_request], "response": [self._on_response]}
        return client

    async def _on_request(self, request: Any) -> None:
        if not request.url.path.endswith(CHAT_PATH):
            return
        before = await self._per_request() if self._per_request else None
        self._pending[id(request)] = (_QUESTION.get(), time.perf_counter(), request.content, before)

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


class Sampler:
    """Samples the server's generated-token counter every `period` seconds."""

    def __init__(self, server: Server, period: float = 0.5) -> None:
        self.server, self.period = server, period
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                c = await self.server.counters()
                self.samples.append((time.perf_counter(), c.generation_tokens or 0.0))
            await asyncio.sleep(self.period)

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            c = await self.server.counters()
            self.samples.append((time.perf_counter(), c.generation_tokens or 0.0))


# ------------------------------------------------------------------------ measurements


@dataclass(frozen=True)
class Settings:
    """What the graph runs with, and the benchmark's own knobs."""

    questions: int = 8
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    gates: tuple[str, ...] = DEFAULT_GATES
    concurrency: int = 8
    levels: tuple[int, ...] = DEFAULT_LEVELS
    raw_seconds: float = 12.0
    gamma: float = 0.9
    graph: dict[str, int] = field(default_factory=lambda: dict(SMALL_SETTINGS))
    n_choice_reps: int = 4
    sample: bool = True

    def context(self, gate: str) -> Any:
        from graphs.state import Context

        return Context(gate=gate, gamma=self.gamma, **self.graph)


class Bench:
    """Runs the four measurements against one server; everything in one event loop."""

    def __init__(self, server: Server, settings: Settings, problems: Sequence[Any]) -> None:
        self.server, self.settings, self.problems = server, settings, problems
        self.salt = secrets.token_hex(6)
        self.log: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True)

    def _salt(self, label: str) -> str:
        return f"bench-{self.salt}-{label}"

    async def run_graph(
        self,
        label: str,
        strategy: str,
        gate: str,
        concurrency: int,
        problems: Sequence[Any],
        *,
        per_request_counters: bool = False,
    ) -> GraphRun:
        """Run the graph on `problems` (at most `concurrency` in flight), recording requests."""
        from graphs.mur import build_graph
        from servers.clients import make_chat_model

        recorder = Recorder(self.server.counters if per_request_counters else None)
        model = make_chat_model(
            self.server.base_url,
            self.server.model,
            extra_body={"cache_salt": self._salt(label)},
            http_async_client=recorder.http_client(),
        )
        graph = build_graph(strategy, backbone=model, verifier=model)
        context = self.settings.context(gate)
        run = GraphRun(label, strategy, gate, concurrency, len(problems))
        limit = asyncio.Semaphore(concurrency)
        results: list[dict[str, Any]] = []

        async def one(index: int, problem: Any) -> None:
            async with limit:
                run.last_question_start = time.perf_counter()
                _QUESTION.set(index)
                try:
                    result = await graph.ainvoke(
                        {"question": problem.question, "system_prompt": problem.system_prompt},
                        context=context,
                    )
                except Exception as exc:  # recorded; the benchmark goes on
                    run.failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    return
                results.append(result)

        await self.server.idle()
        before = await self.server.counters()
        cpu0 = time.process_time()
        run.start = time.perf_counter()
        sampler = Sampler(self.server) if self.settings.sample else None
        async with sampler or contextlib.nullcontext():
            await asyncio.gather(*(one(i, p) for i, p in enumerate(problems)))
            run.wall_s = time.perf_counter() - run.start
            run.cpu_s = time.process_time() - cpu0
        run.server = await self.server.counters() - before
        run.samples = sampler.samples if sampler else []
        for result in results:
            usage = result["usage"]
            run.backbone_tokens += usage["backbone_tokens"]
            run.external_tokens += usage["external_tokens"]
            run.calls += usage["llm_calls"]
            for step in result["steps"]:
                scaled, total = run.scaled_by_step.get(step["index"], (0, 0))
                run.scaled_by_step[step["index"]] = (scaled + int(step["scaled"]), total + 1)
                run.steps_total += 1
                run.steps_scaled += int(step["scaled"])
        run.requests = recorder.requests()
        self.log(
            f"  {label}: {len(results)}/{len(problems)} questions, {run.total_tokens:,} tokens, "
            f"{run.calls} calls, {run.wall_s:.1f} s"
            + (f", {len(run.failures)} failed: {run.failures[0]}" if run.failures else "")
        )
        return run

    async def _send(self, client: Any, body: dict[str, Any]) -> Any:
        rest = {k: v for k, v in body.items() if k not in ("model", "messages")}
        return await client.chat.completions.create(
            model=body["model"], messages=body["messages"], extra_body=rest
        )

    async def replay(self, run: GraphRun) -> ReplayRun:
        """The graph's requests, question by question and wave by wave, at its concurrency."""
        import openai

        plan = plan_waves(run.requests)
        salt = self._salt(f"{run.label}-replay")
        client = openai.AsyncOpenAI(
            base_url=self.server.base_url, api_key="EMPTY", max_retries=0, timeout=600
        )
        limit = asyncio.Semaphore(run.concurrency)

        async def question(waves: list[list[RecordedRequest]]) -> None:
            async with limit:
                for wave in waves:
                    await asyncio.gather(
                        *(self._send(client, replay_body(r, salt)) for r in wave)
                    )

        await self.server.idle()
        before = await self.server.counters()
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(question(waves) for waves in plan))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        server = await self.server.counters() - before
        await client.close()
        self.log(f"  replay {run.label}: {len(run.requests)} requests, {wall:.1f} s")
        return ReplayRun(run.label, wall, cpu, server, len(run.requests))

    async def raw(self, run: GraphRun, concurrency: int, seconds: float) -> RawRun:
        """The server's batched throughput: `concurrency` workers sending the run's request
        bodies (recorded lengths, forced) back to back for `seconds`, no dependencies."""
        import openai

        bodies = sorted(run.requests, key=lambda r: (r.question, r.start))
        client = openai.AsyncOpenAI(
            base_url=self.server.base_url, api_key="EMPTY", max_retries=0, timeout=600
        )
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        done = 0

        def refill(round_: int) -> None:
            salt = self._salt(f"raw-c{concurrency}-{round_}")
            for request in bodies:
                queue.put_nowait(replay_body(request, salt))

        async def worker() -> None:
            nonlocal done
            round_ = 0
            while True:
                if queue.empty():
                    round_ += 1
                    refill(round_)
                await self._send(client, queue.get_nowait())
                done += 1

        refill(0)
        await self.server.idle()
        before = await self.server.counters()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await asyncio.sleep(seconds)
        after = await self.server.counters()
        elapsed = time.perf_counter() - t0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await self.server.idle()
        self.log(f"  raw x{concurrency}: {done} requests in {elapsed:.1f} s")
        return RawRun(concurrency, elapsed, after - before, done)

    async def n_choices(self, run: GraphRun) -> list[NChoiceRun]:
        """N candidates for a step: one request with n = N vs N concurrent requests, each
        after the same warm-up draft (as in the graph, where the draft cached the prefix)."""
        import openai

        n = self.settings.graph.get("num_candidates", 4)
        drafts = [r for r in run.requests if step_of(r.body) == 2][: self.settings.n_choice_reps]
        client = openai.AsyncOpenAI(
            base_url=self.server.base_url, api_key="EMPTY", max_retries=0, timeout=600
        )
        length = self.settings.graph["max_step_tokens"]
        totals: dict[str, NChoiceRun] = {}
        for rep, draft in enumerate(drafts):
            order = ("one request", "separate") if rep % 2 == 0 else ("separate", "one request")
            for kind in order:
                salt = self._salt(f"nchoice-{rep}-{kind.replace(' ', '-')}")
                warm = replace(draft, choice_tokens=(length,), completion_tokens=length)
                await self._send(client, replay_body(warm, salt))
                await self.server.idle()
                before = await self.server.counters()
                t0 = time.perf_counter()
                if kind == "one request":
                    body = {**replay_body(warm, salt), "n": n}
                    await self._send(client, body)
                else:
                    await asyncio.gather(
                        *(self._send(client, replay_body(warm, salt)) for _ in range(n))
                    )
                wall = time.perf_counter() - t0
                delta = await self.server.counters() - before
                label = f"{kind}: n={n}" if kind == "one request" else f"{n} requests, n=1"
                prev = totals.get(label)
                totals[label] = NChoiceRun(
                    label,
                    wall + (prev.wall_s if prev else 0.0),
                    _add(prev.server, delta) if prev else delta,
                )
        await client.close()
        return list(totals.values())


def _add(a: Counters, b: Counters) -> Counters:
    values = {}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        values[f.name] = None if x is None or y is None else x + y
    return Counters(**values)


# ---------------------------------------------------------------------------- report


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB RAM"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores{mem}, {platform.system()} {platform.release()}"


def load_line() -> str:
    with contextlib.suppress(OSError):
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return "-"


# ---------------------------------------------------------------------------- command


def _csv(kind: type) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        values = tuple(kind(part.strip()) for part in text.split(",") if part.strip())
        if not values:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return values

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m evals.bench",
        description="MUR's token economy and the orchestration's speed, side by side.",
    )
    parser.add_argument("--questions", type=int, default=8, help="MATH-500 questions (first N)")
    parser.add_argument(
        "--strategies", type=_csv(str), default=DEFAULT_STRATEGIES, help="refine strategies"
    )
    parser.add_argument("--gates", type=_csv(str), default=DEFAULT_GATES, help="gates to compare")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="questions in flight for tables 1 and 2"
    )
    parser.add_argument(
        "--concurrency-levels",
        type=_csv(int),
        default=DEFAULT_LEVELS,
        help="questions in flight for table 3",
    )
    parser.add_argument(
        "--raw-seconds", type=float, default=12.0, help="duration of each raw throughput window"
    )
    parser.add_argument("--gamma", type=float, default=0.9)
    for name, default in SMALL_SETTINGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--data-dir", help="benchmark data folder (default: ../shared/data)")
    parser.add_argument(
        "--base-url", help="a running vLLM server (default: start/reuse the embedded one)"
    )
    parser.add_argument("--model", help="model name at --base-url (default: what it serves)")
    parser.add_argument("--profile", default="cpu-tiny", help="server profile to start/reuse")
    parser.add_argument(
        "--profile-port", type=int, help="start/reuse the profile's server on this port instead"
    )
    parser.add_argument("--eager", action="store_true", help="start the server eager (slower)")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown file to write")
    return parser


def connect(args: argparse.Namespace) -> tuple[str, str, str]:
    """(base_url, model, description) of the server under test, started if needed."""
    from servers.clients import resolve_model
    from servers.launcher import up
    from servers.profiles import get_profile

    if args.base_url:
        return args.base_url, args.model or resolve_model(args.base_url), args.base_url
    profile = get_profile(args.profile)
    if args.profile_port:
        profile = replace(profile, name=f"{profile.name}-bench", port=args.profile_port)
    server = up(profile, eager=args.eager)
    mode = "eager" if args.eager else "compiled"
    what = f"profile {args.profile} on port {profile.port} ({'started' if server.started else 'reused'}; {mode} if started here)"
    return server.base_url, server.model, what


async def run_all(bench: Bench) -> dict[str, Any]:
    """Every measurement, in an order that keeps each comparison side by side."""
    s, log = bench.settings, bench.log
    problems = bench.problems
    out: dict[str, Any] = {}
    # Warm-up: the first requests after a start pay for compilation and allocation.
    warm = await bench.run_graph("warm-up", s.strategies[0], "never", 2, problems[:2])
    del warm

    log("1. token economy")
    economy: list[GraphRun] = []
    overhead: list[tuple[GraphRun, ReplayRun]] = []
    for strategy in s.strategies:
        for gate in s.gates:
            run = await bench.run_graph(
                f"{strategy}/{gate}", strategy, gate, s.concurrency, problems
            )
            economy.append(run)
            if gate == "mur":
                log("2. orchestration overhead (replay of the run just made)")
                overhead.append((run, await bench.replay(run)))
    out["economy"], out["overhead"] = economy, overhead

    log("3. concurrency scaling")
    scaling: list[tuple[GraphRun, RawRun]] = []
    strategy = s.strategies[0]
    for level in s.levels:
        count = max(2 * level, 2)
        subset = [problems[i % len(problems)] for i in range(count)]
        run = await bench.run_graph(f"{strategy}/mur x{level}", strategy, "mur", level, subset)
        raw = await bench.raw(run, level, s.raw_seconds)
        scaling.append((run, raw))
        if level == 1:
            overhead.append((run, await bench.replay(run)))
    out["scaling"] = scaling

    log("4. request efficiency")
    source = next((r for r in economy if r.gate == "mur"), economy[0])
    out["n_choices"] = await bench.n_choices(source)
    seq = await bench.run_graph(
        f"{s.strategies[-1]}/mur sequential",
        s.strategies[-1],
        "mur",
        1,
        problems[:2],
        per_request_counters=True,
    )
    out["sequential"] = seq
    out["block_size"] = parse_block_size(await bench.server.metrics_text())
    out["version"] = await bench.server.version()
    return out


def render(
    out: dict[str, Any], settings: Settings, command: str, header: dict[str, str]
) -> str:
    """BENCHMARKS.md (everything above the notes marker)."""
    economy_md, economy_goals = economy_table(out["economy"])
    overhead_md, overhead_goals = overhead_table(out["overhead"])
    scaling_md, scaling_goals = scaling_table(out["scaling"])
    mur_runs = [r for r in out["economy"] if r.gate == "mur"]
    parts = [
        "# Benchmarks: MUR's token economy and the orchestration's speed",
        "",
        f"- Command: `{command}`",
        *(f"- {key}: {value}" for key, value in header.items()),
        "- Graph settings: "
        + ", ".join(f"{k}={v}" for k, v in settings.graph.items())
        + f", gamma={settings.gamma} (other settings: the paper's defaults)",
        "",
        "Every comparison is two measurements taken side by side in this run; tokens are the",
        "graph's own accounting, `server tok` the server's `vllm:generation_tokens_total` delta.",
        "",
        f"## 1. Token economy ({settings.questions} MATH-500 questions, "
        f"{settings.concurrency} in flight)",
        "",
        economy_md,
        "",
        *economy_goals,
        "",
        "## 2. Orchestration overhead (graph vs direct replay of its exact requests)",
        "",
        "The replay sends the recorded request bodies with `openai.AsyncOpenAI`, each question's "
        "requests in order (concurrent ones together), at the graph's concurrency, every choice "
        "forced to its recorded length (`min_tokens` = `max_tokens`, `ignore_eos`), in its own "
        "prefix-cache space (`cache_salt`).",
        "",
        overhead_md,
        "",
        *overhead_goals,
        "",
        "## 3. Concurrency scaling (graph tok/s vs the server's raw batched tok/s)",
        "",
        f"Graph: {settings.strategies[0]} / mur on 2x as many questions as in flight. Raw: as "
        f"many workers sending that run's request bodies back to back (recorded lengths "
        f"forced, no dependencies) for {settings.raw_seconds:g} s. tok/s from the server's "
        "counter; `steady` = until the last question started (every slot busy); `tok / engine "
        "step` = the server's mean batch (prefill + decode tokens per step).",
        "",
        scaling_md,
        "",
        *scaling_goals,
        "",
        "## 4. Request efficiency",
        "",
        "### 4a. N candidates: one request with n = N vs N requests (after the same draft)",
        "",
        n_choice_table(out["n_choices"]),
        "",
        "### 4b. Prefix cache during MUR runs (server counters)",
        "",
        cache_table([*mur_runs, out["sequential"]], out["block_size"]),
        "",
        "### 4c. Prompt tokens per step (one question at a time, counters read per request)",
        "",
        step_table(step_prompt_rows(out["sequential"].requests)),
        "",
    ]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from evals.datasets import load_dataset
    from graphs.state import STRATEGIES, check_strategy
    from nodes.gates import check_gate

    for strategy in args.strategies:
        check_strategy(strategy)
    for gate in args.gates:
        check_gate(gate)
    del STRATEGIES
    if args.questions < 2 or args.concurrency < 1 or min(args.concurrency_levels) < 1:
        print("--questions must be >= 2, concurrency >= 1", file=sys.stderr)
        return 2
    settings = Settings(
        questions=args.questions,
        strategies=tuple(args.strategies),
        gates=tuple(args.gates),
        concurrency=args.concurrency,
        levels=tuple(args.concurrency_levels),
        raw_seconds=args.raw_seconds,
        gamma=args.gamma,
        graph={name: getattr(args, name) for name in SMALL_SETTINGS},
    )
    problems = load_dataset("math500", args.data_dir, limit=max(args.questions, 2))
    base_url, model, where = connect(args)
    command = "python -m evals.bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    started = dt.datetime.now(dt.UTC)
    load_before = load_line()
    t0 = time.monotonic()

    async def go() -> dict[str, Any]:
        server = Server(base_url, model)
        try:
            return await run_all(Bench(server, settings, problems))
        finally:
            await server.aclose()

    out = asyncio.run(go())
    header = {
        "Date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "Machine": machine_line(),
        "Server": f"{model} on vLLM {out['version']} at {base_url} ({where})",
        "Load average (1/5/15 min) before / after": f"{load_before} / {load_line()}",
        "Duration": f"{time.monotonic() - t0:.0f} s",
    }
    text = render(out, settings, command, header)
    print(text)
    path = Path(args.out)
    previous = path.read_text() if path.exists() else None
    path.write_text(merge_notes(text, previous))
    print(f"written: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
