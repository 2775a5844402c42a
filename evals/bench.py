"""`python -m evals.bench`: MUR's token economy and the orchestration's speed, side by side.

One command, one vLLM server, the same MATH-500 questions, four tables written to
BENCHMARKS.md:

1. Token economy: every strategy under the gates `mur`, `always` (Per-Step Scale) and `never`
   (Vanilla CoT): tokens (backbone + external), calls, scaled / total steps, wall time, and the
   ratios MUR / always and MUR / never. Goal (the paper's claim): MUR <= 0.55x always.
2. Orchestration overhead: the graph's wall time against replaying the exact requests it made
   (recorded on the wire, question by question, concurrent requests kept concurrent) with the
   plain async OpenAI client at the same concurrency, every reply forced to its recorded length
   (`min_tokens` = `max_tokens`, `ignore_eos`); also the orchestration's own share of each
   question's critical path and the server's speed during each side. Goal: <= 1.05.
3. Concurrency scaling: graph tokens/s at 1, 2, 4, 8, 16 questions in flight (a window with
   every slot busy, and the whole run) against the server's raw batched throughput at the same
   concurrency (the graph's recorded requests streamed back to back, no client work between
   them), measured just before and after. Goal: >= 0.8 at 8 and above.
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
DEFAULT_GATES: tuple[str, ...] = ("mur", "mur+bc", "always", "never")
# A gate name with this suffix runs with bias correction (M_{t-1} / (1 - alpha^(t-1))).
BIAS_CORRECTED = "+bc"
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
NOTES_MARKER = (
    "<!-- notes: everything below this line is kept when evals.bench rewrites the file -->"
)

# vLLM's Prometheus counters the benchmark reads (sums over label sets).
COUNTERS: dict[str, str] = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "cache_queries": "vllm:prefix_cache_queries_total",
    "cache_hits": "vllm:prefix_cache_hits_total",
    "step_tokens": "vllm:iteration_tokens_total_sum",
    "steps": "vllm:iteration_tokens_total_count",
    "itl_sum": "vllm:inter_token_latency_seconds_sum",
    "itl_count": "vllm:inter_token_latency_seconds_count",
    "e2e_sum": "vllm:e2e_request_latency_seconds_sum",
    "e2e_count": "vllm:e2e_request_latency_seconds_count",
    "queue_sum": "vllm:request_queue_time_seconds_sum",
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
    itl_sum: float | None = None
    itl_count: float | None = None
    e2e_sum: float | None = None
    e2e_count: float | None = None
    queue_sum: float | None = None
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
    def inter_token_s(self) -> float | None:
        """Mean time between two tokens of a request: how fast the server was stepping."""
        return ratio(self.itl_sum, self.itl_count)

    @property
    def sequences_per_step(self) -> float | None:
        """Generated tokens per engine step: the mean number of sequences decoding together,
        i.e. how full the batch was, whatever the server's speed."""
        return ratio(self.generation_tokens, self.steps)

    @property
    def tokens_per_step(self) -> float | None:
        """Mean tokens per engine step (prefill + decode): how full the batch was."""
        return ratio(self.step_tokens, self.steps)


def parse_counters(text: str) -> Counters:
    """The counters of `COUNTERS` from a Prometheus /metrics text."""
    return Counters(**{key: parse_counter(text, name) for key, name in COUNTERS.items()})


def add_counters(a: Counters, b: Counters) -> Counters:
    """Field-wise sum (None when either side lacks the counter)."""
    values = {}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        values[f.name] = None if x is None or y is None else x + y
    return Counters(**values)


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


def parse_gate(spec: str) -> tuple[str, bool]:
    """`mur` -> ("mur", False); `mur+bc` -> ("mur", True): the gate and its bias correction."""
    if spec.endswith(BIAS_CORRECTED):
        return spec.removesuffix(BIAS_CORRECTED), True
    return spec, False


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


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def speed_normalized(
    wall_a: float, server_a: Counters, wall_b: float, server_b: Counters
) -> float | None:
    """(wall_a / a's time per token) / (wall_b / b's time per token): the ratio of two wall
    times with the server's speed during each factored out (load on a shared machine)."""
    a, b = server_a.inter_token_s, server_b.inter_token_s
    if not a or not b:
        return None
    return ratio(wall_a / a, wall_b / b)


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
    """Tokens per choice that forcing one request can give: the recorded completion tokens
    spread over its n choices (rounded up), at least 1."""
    total = sum(request.choice_tokens) or request.completion_tokens
    return max(1, math.ceil(total / max(request.n, 1)))


def replay_body(
    request: RecordedRequest, salt: str | None, length: int | None = None
) -> dict[str, Any]:
    """The recorded body forced to `length` tokens per choice (default `forced_length`), in
    its own prefix-cache space.

    Messages, n, logprobs, stop strings and sampling stay as sent (vLLM ignores stop strings
    before `min_tokens`); `cache_salt` keeps it from reusing another run's cached prefixes.
    """
    body = dict(request.body)
    length = forced_length(request) if length is None else max(1, length)
    body.pop("max_completion_tokens", None)
    body.pop("stream", None)
    body.update(max_tokens=length, min_tokens=length, ignore_eos=True)
    if salt:
        body["cache_salt"] = salt
    return body


def replay_bodies(request: RecordedRequest, salt: str | None) -> list[dict[str, Any]]:
    """What replays one recorded request with the same tokens AND the same latency.

    n = 1: the body, forced to its length. n > 1: the choices had different lengths and the
    graph waited for the longest, which no single forced request reproduces; vLLM serves
    n > 1 as n independent sequences anyway (table 4a: same prompt work, same wall time), so
    the replay sends one n = 1 request per choice, each forced to that choice's length.
    """
    if request.n == 1 or len(request.choice_tokens) != request.n:
        return [replay_body(request, salt)]
    single = replace(request, body={k: v for k, v in request.body.items() if k != "n"})
    return [replay_body(single, salt, length) for length in request.choice_tokens]


def step_of(body: dict[str, Any]) -> int | None:
    """The step index a draft request continues (`...StepT:` as the last assistant message),
    or None for any other request (judges, candidates with n > 1, revisions, fallbacks)."""
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "assistant" or int(body.get("n") or 1) != 1:
        return None
    if sum(m.get("role") == "assistant" for m in messages) > 1:
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
    max_hits: float | None = None


def max_cache_hit(prompt_tokens: int, block_size: int | None) -> int | None:
    """The most a prefix cache of `block_size`-token blocks can serve of a prompt: whole
    blocks only, and never the last token (it must be computed to sample the next one)."""
    if not block_size:
        return None
    return block_size * (max(prompt_tokens - 1, 0) // block_size)


def step_prompt_rows(
    requests: Sequence[RecordedRequest], block_size: int | None = None
) -> list[StepPromptRow]:
    """Per step index: mean prompt tokens of the draft requests, their growth over the same
    question's previous draft (the new text the server has never seen), the cached tokens,
    the tokens recomputed (prompt - cached) and the most whole blocks could have served."""
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
                max_hits=(
                    sum(max_cache_hit(p, block_size) or 0 for p in prompts) / len(prompts)
                    if block_size
                    else None
                ),
            )
        )
    return rows


@dataclass(frozen=True)
class ClientTime:
    """Where one question's wall time went: inside requests (a wave's first send to its last
    answer) or in the client between them (graph, nodes, parsing: the orchestration)."""

    questions: int
    wall_s: float
    in_requests_s: float
    between_s: float
    waves: int

    @property
    def between_per_wave_ms(self) -> float | None:
        return ratio(1000 * self.between_s, self.waves)

    @property
    def between_share(self) -> float | None:
        return ratio(self.between_s, self.wall_s)


def client_time(
    requests: Iterable[RecordedRequest], spans: dict[int, tuple[float, float]]
) -> ClientTime:
    """Split each question's span (graph call to return) into time inside its request waves
    and time between them, summed over questions: the critical path of the orchestration."""
    plan = dict(zip(sorted({r.question for r in requests}), plan_waves(requests), strict=True))
    wall = inside = 0.0
    waves = 0
    for question, (begin, end) in spans.items():
        wall += end - begin
        for wave in plan.get(question, []):
            inside += max(r.end for r in wave) - min(r.start for r in wave)
            waves += 1
    return ClientTime(len(spans), wall, inside, max(wall - inside, 0.0), waves)


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
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)
    window_s: float | None = None
    window: Counters | None = None

    @property
    def total_tokens(self) -> int:
        return self.backbone_tokens + self.external_tokens

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens per second of the whole run (the server's count)."""
        return ratio(self.server.generation_tokens, self.wall_s)

    @property
    def window_tokens_per_s(self) -> float | None:
        """Tokens/s of the window in which every slot always had a question."""
        if self.window is None or self.window_s is None:
            return None
        return ratio(self.window.generation_tokens, self.window_s)

    @property
    def client(self) -> ClientTime:
        return client_time(self.requests, self.spans)


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

    def __add__(self, other: RawRun) -> RawRun:
        return RawRun(
            self.concurrency,
            self.seconds + other.seconds,
            add_counters(self.server, other.server),
            self.requests_done + other.requests_done,
        )

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
    for run in runs:
        always = by_key.get((run.strategy, "always"))
        never = by_key.get((run.strategy, "never"))
        if run.gate in ("always", "never") or not always:
            continue
        tok = ratio(run.total_tokens, always.total_tokens)
        name = "MUR" if run.gate == "mur" else run.gate
        goals.append(
            f"- {run.strategy}, {run.gate}: {name} / always = {fmt_ratio(tok)} tokens "
            f"({fmt_ratio(ratio(run.calls, always.calls))} calls, "
            f"{fmt_ratio(ratio(run.wall_s, always.wall_s))} wall); {name} / never = "
            f"{fmt_ratio(ratio(run.total_tokens, never.total_tokens if never else None))} "
            f"tokens. Goal <= {GOAL_TOKENS:.2f}x: **{verdict(tok, GOAL_TOKENS, at_most=True)}**"
            f" (scaled {run.steps_scaled} of {run.steps_total} steps; by step index "
            + ", ".join(f"t={t}: {s}/{n}" for t, (s, n) in sorted(run.scaled_by_step.items()))
            + ")"
        )
    return table, goals


def overhead_table(pairs: Sequence[tuple[GraphRun, ReplayRun]]) -> tuple[str, list[str]]:
    """Table 2 and its goal lines: each graph run against its replay, and all of them pooled.

    `client between requests` is the part of each question's wall time spent outside any
    request (graph, nodes, langchain, parsing): the orchestration's own cost on the critical
    path, immune to the server's speed; `graph / replay (client only)` is the ratio it alone
    would give: wall / (wall - between).
    """
    rows, goals = [], []
    for graph, replay in pairs:
        client = graph.client
        rows.append(
            [
                graph.label,
                graph.questions,
                graph.concurrency,
                replay.requests,
                fmt(graph.wall_s, 1),
                fmt(replay.wall_s, 1),
                fmt_ratio(ratio(graph.wall_s, replay.wall_s)),
                fmt(100 * client.between_share if client.between_share is not None else None, 2),
                fmt(client.between_per_wave_ms, 1),
                fmt_ratio(ratio(client.wall_s, client.wall_s - client.between_s)),
                f"{fmt_ms(graph.server.inter_token_s)} / {fmt_ms(replay.server.inter_token_s)}",
                fmt_ratio(
                    speed_normalized(graph.wall_s, graph.server, replay.wall_s, replay.server)
                ),
                f"{fmt(graph.cpu_s, 1)} / {fmt(replay.cpu_s, 1)}",
                f"{fmt(int(graph.server.generation_tokens or 0))} / "
                f"{fmt(int(replay.server.generation_tokens or 0))}",
            ]
        )
    if pairs:
        graph_wall = sum(g.wall_s for g, _ in pairs)
        replay_wall = sum(r.wall_s for _, r in pairs)
        wall_ratio = ratio(graph_wall, replay_wall)
        spans = sum(g.client.wall_s for g, _ in pairs)
        between = sum(g.client.between_s for g, _ in pairs)
        client_ratio = ratio(spans, spans - between)
        # Each run's wall time in units of the server's own step time, then pooled.
        normalized = [
            (g.wall_s / g.server.inter_token_s, r.wall_s / r.server.inter_token_s)
            for g, r in pairs
            if g.server.inter_token_s and r.server.inter_token_s
        ]
        pooled_normalized = ratio(sum(a for a, _ in normalized), sum(b for _, b in normalized))
        rows.append(
            [
                "**all runs pooled**",
                sum(g.questions for g, _ in pairs),
                "",
                sum(r.requests for _, r in pairs),
                fmt(graph_wall, 1),
                fmt(replay_wall, 1),
                fmt_ratio(wall_ratio),
                fmt(100 * ratio(between, spans) if spans else None, 2),
                "",
                fmt_ratio(client_ratio),
                "",
                fmt_ratio(pooled_normalized),
                "",
                "",
            ]
        )
        goals.append(
            f"- Pooled graph / replay wall time = {fmt_ratio(wall_ratio)} (per run "
            + ", ".join(fmt_ratio(ratio(g.wall_s, r.wall_s)) for g, r in pairs)
            + f"). Goal <= {GOAL_OVERHEAD:.2f}x: "
            f"**{verdict(wall_ratio, GOAL_OVERHEAD, at_most=True)}**. With each side's wall "
            "time counted in the server's own time per token during it (the machine's load "
            f"changes between the two): {fmt_ratio(pooled_normalized)} "
            f"(**{verdict(pooled_normalized, GOAL_OVERHEAD, at_most=True)}**)."
        )
        share = fmt(100 * between / spans if spans else None, 2)
        goals.append(
            f"- The orchestration's own share of the critical path: {share}% "
            f"of question time is spent between requests, i.e. graph / replay = "
            f"{fmt_ratio(client_ratio)} from the client alone "
            f"(**{verdict(client_ratio, GOAL_OVERHEAD, at_most=True)}**)."
        )
    table = markdown_table(
        [
            "run",
            "questions",
            "in flight",
            "requests",
            "graph wall s",
            "replay wall s",
            "graph / replay",
            "client between requests %",
            "client ms / wave",
            "graph / replay (client only)",
            "server ms / token graph / replay",
            "graph / replay (server speed normalized)",
            "client CPU s graph / replay",
            "server tok graph / replay",
        ],
        rows,
    )
    return table, goals


def scaling_table(pairs: Sequence[tuple[GraphRun, RawRun]]) -> tuple[str, list[str]]:
    """Table 3 and its goal lines (levels at and above GOAL_SCALING_FROM).

    Two ratios per level: tok/s (what the goal names; the machine's load moves it between the
    graph's window and the raw windows) and sequences decoding per engine step (how full the
    graph keeps the batch compared with raw, independent of the server's speed).
    """
    rows, goals = [], []
    for graph, raw in pairs:
        window = ratio(graph.window_tokens_per_s, raw.tokens_per_s)
        whole = ratio(graph.tokens_per_s, raw.tokens_per_s)
        graph_batch = graph.window.sequences_per_step if graph.window else None
        batch = ratio(graph_batch, raw.server.sequences_per_step)
        rows.append(
            [
                graph.concurrency,
                graph.questions,
                fmt(graph.window_tokens_per_s),
                fmt(graph.tokens_per_s),
                fmt(raw.tokens_per_s),
                fmt_ratio(window),
                fmt_ratio(whole),
                f"{fmt(graph_batch, 2)} / {fmt(raw.server.sequences_per_step, 2)}",
                fmt_ratio(batch),
                f"{fmt_ms(graph.window.inter_token_s if graph.window else None)} / "
                f"{fmt_ms(raw.server.inter_token_s)}",
                fmt(100 * graph.cpu_s / graph.wall_s if graph.wall_s else None, 1),
            ]
        )
        if graph.concurrency >= GOAL_SCALING_FROM:
            goals.append(
                f"- {graph.concurrency} questions in flight: graph / raw = {fmt_ratio(window)} "
                f"tok/s while every slot is busy ({fmt_ratio(whole)} over the whole run, drain "
                f"included). Goal >= {GOAL_SCALING:.2f}x: "
                f"**{verdict(window, GOAL_SCALING, at_most=False)}**. Batch fill, graph / raw "
                f"= {fmt_ratio(batch)} (**{verdict(batch, GOAL_SCALING, at_most=False)}**)."
            )
    table = markdown_table(
        [
            "in flight",
            "questions",
            "graph tok/s (window)",
            "graph tok/s (whole run)",
            "raw tok/s",
            "graph / raw (window)",
            "graph / raw (whole run)",
            "sequences per engine step graph / raw",
            "batch fill graph / raw",
            "server ms / token graph / raw",
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
            "most whole blocks can hit",
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
                fmt(r.max_hits),
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
        self._http = httpx.AsyncClient(timeout=60)

    async def metrics_text(self, attempts: int = 3) -> str:
        """/metrics; retried, as a server starved of CPU can miss a beat (shared machines)."""
        import httpx

        for attempt in range(attempts):
            try:
                resp = await self._http.get(f"{self.root}/metrics")
                resp.raise_for_status()
                return resp.text
            except (httpx.TimeoutException, httpx.TransportError):
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(2.0 * (attempt + 1))
        raise AssertionError("unreachable")

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


# ------------------------------------------------------------------------ measurements


@dataclass(frozen=True)
class Settings:
    """What the graph runs with, and the benchmark's own knobs."""

    questions: int = 8
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    gates: tuple[str, ...] = DEFAULT_GATES
    concurrency: int = 8
    levels: tuple[int, ...] = DEFAULT_LEVELS
    scaling_strategy: str = "critic"
    window_s: float = 20.0
    raw_seconds: float = 12.0
    gamma: float = 0.9
    graph: dict[str, int] = field(default_factory=lambda: dict(SMALL_SETTINGS))
    n_choice_reps: int = 4
    profile_graph: str | None = None

    def context(self, spec: str) -> Any:
        """The run's Context for a gate spec (`mur`, `mur+bc`, `always`, ...)."""
        from graphs.state import Context

        gate, bias_correction = parse_gate(spec)
        return Context(gate=gate, gamma=self.gamma, bias_correction=bias_correction, **self.graph)


class Bench:
    """Runs the four measurements against one server; everything in one event loop."""

    def __init__(self, server: Server, settings: Settings, problems: Sequence[Any]) -> None:
        self.server, self.settings, self.problems = server, settings, problems
        self.salt = secrets.token_hex(6)
        self.log: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True)

    def _salt(self, label: str) -> str:
        """A prefix-cache space of its own for one run (vLLM refuses '/', '@', '\\')."""
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)
        return f"bench-{self.salt}-{safe}"[:128]

    async def run_graph(
        self,
        label: str,
        strategy: str,
        gate: str,
        concurrency: int,
        problems: Sequence[Any],
        *,
        window_s: float | None = None,
        per_request_counters: bool = False,
    ) -> GraphRun:
        """Run the graph on `problems`, `concurrency` at a time in their order, recording
        every request. With `window_s`, new questions start only during the first `window_s`
        seconds (the counters are read when it closes) and the run ends when those finish."""
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
        run = GraphRun(label, strategy, gate, concurrency, 0, window_s=window_s)
        results: list[dict[str, Any]] = []
        queue = list(enumerate(problems))[::-1]
        deadline = math.inf

        async def worker() -> None:
            while queue and time.perf_counter() < deadline:
                index, problem = queue.pop()
                run.questions += 1
                begin = time.perf_counter()
                _QUESTION.set(index)
                try:
                    result = await graph.ainvoke(
                        {"question": problem.question, "system_prompt": problem.system_prompt},
                        context=context,
                    )
                except Exception as exc:  # recorded; the benchmark goes on
                    run.failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    continue
                run.spans[index] = (begin, time.perf_counter())
                results.append(result)

        async def close_window(start: Counters) -> None:
            await asyncio.sleep(window_s or 0)
            run.window = await self.server.counters() - start

        await self.server.idle()
        before = await self.server.counters()
        cpu0, t0 = time.process_time(), time.perf_counter()
        if window_s is not None:
            deadline = t0 + window_s
            window = asyncio.create_task(close_window(before))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.wall_s, run.cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
        if window_s is not None:
            await window
        run.server = await self.server.counters() - before
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
        if run.failures and not results:
            raise RuntimeError(f"every question of {label} failed: {run.failures[0]}")
        self.log(
            f"  {label}: {len(results)}/{run.questions} questions, {run.total_tokens:,} tokens, "
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
                    bodies = [b for r in wave for b in replay_bodies(r, salt)]
                    await asyncio.gather(*(self._send(client, b) for b in bodies))

        await self.server.idle()
        before = await self.server.counters()
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(question(waves) for waves in plan))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        server = await self.server.counters() - before
        await client.close()
        self.log(f"  replay {run.label}: {len(run.requests)} requests, {wall:.1f} s")
        return ReplayRun(run.label, wall, cpu, server, len(run.requests))

    async def raw(
        self, requests: Sequence[RecordedRequest], concurrency: int, seconds: float, label: str
    ) -> RawRun:
        """The server's batched throughput on the graph's own request mix: `concurrency`
        streams, each taking a recorded question and sending its requests one after another
        (recorded lengths forced, nothing in between), then the next question, for `seconds`.
        Each pass over the questions gets a fresh prefix-cache space, so prompts hit the cache
        as they did in the graph (a question's earlier steps only)."""
        import openai

        chains = [[r for wave in waves for r in wave] for waves in plan_waves(requests)]
        client = openai.AsyncOpenAI(
            base_url=self.server.base_url, api_key="EMPTY", max_retries=0, timeout=600
        )
        pending: list[tuple[str, list[RecordedRequest]]] = []
        passes = done = 0

        async def stream() -> None:
            nonlocal passes, done
            while True:
                if not pending:
                    passes += 1
                    salt = self._salt(f"raw-{label}-{passes}")
                    pending.extend((salt, chain) for chain in reversed(chains))
                salt, chain = pending.pop()
                for request in chain:
                    bodies = replay_bodies(request, salt)
                    await asyncio.gather(*(self._send(client, b) for b in bodies))
                    done += 1

        await self.server.idle()
        before = await self.server.counters()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(stream()) for _ in range(concurrency)]
        await asyncio.sleep(seconds)
        after = await self.server.counters()
        elapsed = time.perf_counter() - t0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await self.server.idle()
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
                    add_counters(prev.server, delta) if prev else delta,
                )
        await client.close()
        return list(totals.values())


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
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
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
        description="MUR's token economy and the orchestration's speed, side by side; "
        "writes the four tables to --out.",
    )
    parser.add_argument("--questions", type=int, default=8, help="MATH-500 questions (first N)")
    parser.add_argument(
        "--strategies",
        type=_csv(str),
        default=DEFAULT_STRATEGIES,
        help=f"refine strategies (default {','.join(DEFAULT_STRATEGIES)})",
    )
    parser.add_argument(
        "--gates",
        type=_csv(str),
        default=DEFAULT_GATES,
        help=f"gates to compare (default {','.join(DEFAULT_GATES)})",
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="questions in flight in tables 1 and 2"
    )
    parser.add_argument(
        "--concurrency-levels",
        type=_csv(int),
        default=DEFAULT_LEVELS,
        help="questions in flight in table 3 (default 1,2,4,8,16)",
    )
    parser.add_argument(
        "--scaling-strategy",
        default=None,
        help="strategy of table 3 (default: critic if benchmarked, else the first)",
    )
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=20.0,
        help="table 3: seconds during which new questions start at each level",
    )
    parser.add_argument(
        "--raw-seconds",
        type=float,
        default=12.0,
        help="table 3: seconds of raw completions per level (half before, half after the graph)",
    )
    parser.add_argument("--gamma", type=float, default=0.9)
    for name, default in SMALL_SETTINGS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=default, help=f"(default {default})"
        )
    parser.add_argument("--data-dir", help="benchmark data folder (default: ../shared/data)")
    parser.add_argument(
        "--base-url", help="a running vLLM server (default: start/reuse the embedded one)"
    )
    parser.add_argument("--model", help="model name at --base-url (default: what it serves)")
    parser.add_argument("--profile", default="cpu-tiny", help="server profile to start/reuse")
    parser.add_argument(
        "--profile-port",
        type=int,
        help="start/reuse the profile's server on this port (profile name <profile>-bench)",
    )
    parser.add_argument("--eager", action="store_true", help="start the server eager (slower)")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown file to write")
    parser.add_argument(
        "--profile-graph",
        metavar="HTML",
        help="after the tables, run the first strategy's MUR graph once more under "
        "pyinstrument (pip install pyinstrument) and write its profile here",
    )
    return parser


def connect(args: argparse.Namespace) -> tuple[str, str, str]:
    """(base_url, model, description) of the server under test, started if needed."""
    from servers.clients import resolve_model
    from servers.launcher import up
    from servers.profiles import get_profile

    if args.base_url:
        return args.base_url, args.model or resolve_model(args.base_url), "given by --base-url"
    profile = get_profile(args.profile)
    if args.profile_port:
        profile = replace(profile, name=f"{profile.name}-bench", port=args.profile_port)
    server = up(profile, eager=args.eager)
    how = "eager" if args.eager else "compiled"
    state = f"started here, {how}" if server.started else "reused"
    return server.base_url, server.model, f"profile {args.profile}, {state}"


async def run_all(bench: Bench, pool: Sequence[Any]) -> dict[str, Any]:
    """Every measurement, each comparison's two sides back to back."""
    s, log = bench.settings, bench.log
    problems = bench.problems
    out: dict[str, Any] = {"version": await bench.server.version()}
    # Warm-up (not reported): the first requests after a start pay for compilation.
    await bench.run_graph("warm-up", s.strategies[0], "never", 2, problems[:2])

    log("1. token economy (2. each MUR run is replayed right after it)")
    economy: list[GraphRun] = []
    overhead: list[tuple[GraphRun, ReplayRun]] = []
    for strategy in s.strategies:
        for gate in s.gates:
            run = await bench.run_graph(
                f"{strategy}/{gate}", strategy, gate, s.concurrency, problems
            )
            economy.append(run)
            if gate == "mur":
                overhead.append((run, await bench.replay(run)))
    out["economy"] = economy

    log("3. concurrency scaling")
    scaling: list[tuple[GraphRun, RawRun]] = []
    strategy = s.scaling_strategy
    source = next(
        (r for r in economy if r.strategy == strategy and r.gate == "mur"), economy[0]
    ).requests
    for level in s.levels:
        before = await bench.raw(source, level, s.raw_seconds / 2, f"c{level}a")
        run = await bench.run_graph(
            f"{strategy}/mur x{level}", strategy, "mur", level, pool, window_s=s.window_s
        )
        after = await bench.raw(source, level, s.raw_seconds / 2, f"c{level}b")
        raw = before + after
        log(f"  raw x{level}: {raw.requests_done} requests, {fmt(raw.tokens_per_s)} tok/s")
        scaling.append((run, raw))
        if level == 1:
            overhead.append((run, await bench.replay(run)))
    out["scaling"], out["overhead"] = scaling, overhead

    log("4. request efficiency")
    mur_runs = [r for r in economy if r.gate == "mur"] or economy
    out["n_choices"] = await bench.n_choices(mur_runs[0])
    out["sequential"] = await bench.run_graph(
        f"{strategy}/mur one at a time",
        strategy,
        "mur",
        1,
        problems[:2],
        per_request_counters=True,
    )
    out["block_size"] = parse_block_size(await bench.server.metrics_text())
    if s.profile_graph:
        out["profile"] = await profile_graph(bench, s.profile_graph)
    return out


async def profile_graph(bench: Bench, path: str) -> str:
    """One more MUR run of the first strategy under pyinstrument; returns a summary line."""
    from pyinstrument import Profiler

    s = bench.settings
    profiler = Profiler(interval=0.001)
    profiler.start()
    run = await bench.run_graph(
        f"{s.strategies[0]}/mur profiled", s.strategies[0], "mur", s.concurrency, bench.problems
    )
    session = profiler.stop()
    Path(path).write_text(profiler.output_html())
    busy = session.cpu_time
    return (
        f"{run.label}: client CPU {busy:.2f} s over {run.wall_s:.1f} s wall "
        f"({100 * busy / run.wall_s:.1f}% of a core), {1000 * busy / max(len(run.requests), 1):.1f}"
        f" ms per request; pyinstrument profile: {path}"
    )


def render(out: dict[str, Any], settings: Settings, command: str, header: dict[str, str]) -> str:
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
        + f", gamma={settings.gamma}; everything else the paper's defaults (N = 4 candidates, "
        "alpha 0.9, bias correction only in `mur+bc`, temperature 0.6, top_p 0.8, top_k 20, "
        "presence 1.5); "
        "the backbone is also the verifier.",
        "",
        "All numbers come from this one run. Tokens are the graph's own accounting; `server tok` "
        "is the server's `vllm:generation_tokens_total` over the same window (a check). Wall "
        "times depend on the machine's load, so each comparison's two sides run back to back.",
        "",
        f"## 1. Token economy ({settings.questions} MATH-500 questions, "
        f"{settings.concurrency} in flight)",
        "",
        economy_md,
        "",
        *economy_goals,
        "",
        "## 2. Orchestration overhead: the graph vs a direct replay of its exact requests",
        "",
        "Every chat-completions request of a graph run is recorded on the wire (body, reply, "
        "send and answer times, question). The replay sends the same bodies with "
        "`openai.AsyncOpenAI`: each question's requests in their order, requests the graph had "
        "in flight together sent together, as many questions at once as the graph ran, every "
        "choice forced to its recorded length (`min_tokens` = `max_tokens`, `ignore_eos`; a "
        "request with n > 1 goes as n requests, one per choice at that choice's length: vLLM "
        "serves n as n sequences anyway, table 4a), in its own prefix-cache space "
        "(`cache_salt`, as was the graph run). Each replay runs right after its graph run. "
        "`client between requests`: the part of each question's time outside any request "
        "(graph, nodes, langchain, the OpenAI SDK, HTTP set-up), i.e. the orchestration's "
        "own share of the critical path, whatever the server's speed. `server ms / token`: "
        "the server's mean inter-token latency during each side (the machine's load moves "
        "it); the normalized ratio divides each wall time by it.",
        "",
        overhead_md,
        "",
        *overhead_goals,
        "",
        "## 3. Concurrency scaling: graph tok/s vs the server's raw batched tok/s",
        "",
        f"Graph: {settings.scaling_strategy} / mur; at each level as many questions in flight, "
        f"new ones starting for {settings.window_s:g} s (tok/s of that window, every slot "
        "busy), then the started ones finish (whole run, drain included). Raw: as many "
        f"streams replaying the recorded questions of `{settings.scaling_strategy}/mur` "
        "(table 1), each question's requests one after another with nothing in between "
        "(recorded lengths forced), then the next question; "
        f"{settings.raw_seconds / 2:g} s before and {settings.raw_seconds / 2:g} s after the "
        "graph. tok/s from the server's counter. `sequences per engine step`: generated "
        "tokens / engine steps, the mean number of sequences decoding together (how full the "
        "batch was, whatever the server's speed); `server ms / token`: its mean inter-token "
        "latency meanwhile (the load on the machine).",
        "",
        scaling_md,
        "",
        *scaling_goals,
        "",
        "## 4. Request efficiency",
        "",
        "### 4a. N candidates: one request with n = N vs N requests (after the same draft)",
        "",
        f"The step-2 draft request of {settings.n_choice_reps} questions from the first MUR "
        f"run, each time sent once to cache its prefix, then the candidates "
        f"({settings.graph['max_step_tokens']} tokens each, forced); counters summed over the "
        "questions, the two forms alternating which goes first.",
        "",
        n_choice_table(out["n_choices"]),
        "",
        "### 4b. Prefix cache during MUR runs (server counters, tokens)",
        "",
        cache_table([*mur_runs, out["sequential"]], out["block_size"]),
        "",
        "### 4c. Prompt tokens per step (step drafts, one question at a time, counters read "
        "around each request)",
        "",
        step_table(step_prompt_rows(out["sequential"].requests, out["block_size"])),
        "",
        *([f"Client profile: {out['profile']}", ""] if out.get("profile") else []),
    ]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from evals.datasets import load_dataset
    from graphs.refine import check_strategy
    from graphs.state import Context
    from nodes.gates import check_gate

    try:
        for strategy in args.strategies:
            check_strategy(strategy)
        for spec in args.gates:
            check_gate(parse_gate(spec)[0])
        if args.scaling_strategy:
            check_strategy(args.scaling_strategy)
        if args.questions < 2:
            raise ValueError(f"--questions must be >= 2, got {args.questions}")
        if args.concurrency < 1 or min(args.concurrency_levels) < 1:
            raise ValueError("concurrency must be >= 1")
        if args.window_seconds <= 0 or args.raw_seconds <= 0:
            raise ValueError("--window-seconds and --raw-seconds must be > 0")
        graph = {name: getattr(args, name) for name in SMALL_SETTINGS}
        Context(gamma=args.gamma, **graph)  # validates the settings
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scaling_strategy = args.scaling_strategy or (
        "critic" if "critic" in args.strategies else args.strategies[0]
    )
    settings = Settings(
        questions=args.questions,
        strategies=tuple(args.strategies),
        gates=tuple(args.gates),
        concurrency=args.concurrency,
        levels=tuple(args.concurrency_levels),
        scaling_strategy=scaling_strategy,
        window_s=args.window_seconds,
        raw_seconds=args.raw_seconds,
        gamma=args.gamma,
        graph=graph,
        profile_graph=args.profile_graph,
    )
    # Table 3 keeps every slot busy: enough distinct questions for the highest level.
    pool = load_dataset(
        "math500", args.data_dir, limit=max(args.questions, 4 * max(settings.levels))
    )
    problems = pool[: args.questions]
    base_url, model, how = connect(args)
    command = "python -m evals.bench " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    started = dt.datetime.now(dt.UTC)
    load_before = load_line()
    t0 = time.monotonic()

    async def go() -> dict[str, Any]:
        server = Server(base_url, model)
        try:
            return await run_all(Bench(server, settings, problems), pool)
        finally:
            await server.aclose()

    try:
        out = asyncio.run(go())
    except KeyboardInterrupt:
        print("interrupted: nothing written", file=sys.stderr)
        return 130
    except Exception as exc:
        import httpx
        import openai

        if not isinstance(exc, httpx.HTTPError | openai.APIConnectionError):
            raise
        print(
            f"error: the server at {base_url} stopped answering ({type(exc).__name__}: {exc}); "
            "nothing written",
            file=sys.stderr,
        )
        return 1
    header = {
        "Date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "Machine": machine_line(),
        "Server": f"vLLM {out['version']}, {model} at {base_url} ({how})",
        "Load average (1, 5, 15 min)": f"{load_before} before; {load_line()} after",
        "Duration": f"{time.monotonic() - t0:.0f} s",
    }
    text = render(out, settings, command.strip(), header)
    print(text)
    path = Path(args.out)
    previous = path.read_text() if path.exists() else None
    path.write_text(merge_notes(text, previous))
    print(f"written: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
