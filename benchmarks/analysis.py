"""Analyses of recorded requests: which requests are step drafts, what each step re-sends and
recomputes, and how much of a question's time the client spends between requests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mur.benchmarks.counters import Counters, ratio
from mur.benchmarks.recording import RecordedRequest, plan_waves


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
                growth=mean(growths),
                cache_hits=mean(hits),
                recomputed=mean(recomputed),
                max_hits=mean([max_cache_hit(p, block_size) or 0 for p in prompts])
                if block_size
                else None,
            )
        )
    return rows


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


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


def speed_normalized(
    wall_a: float, server_a: Counters, wall_b: float, server_b: Counters
) -> float | None:
    """(wall_a / a's time per token) / (wall_b / b's time per token): the ratio of two wall
    times with the server's speed during each factored out (load on a shared machine)."""
    a, b = server_a.inter_token_s, server_b.inter_token_s
    if not a or not b:
        return None
    return ratio(wall_a / a, wall_b / b)
