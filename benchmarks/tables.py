"""The report's tables, rendered from measurement results (pure), with each goal's verdict."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mur.benchmarks.analysis import StepPromptRow, speed_normalized
from mur.benchmarks.counters import ratio
from mur.benchmarks.results import GraphRun, NChoiceRun, RawRun, ReplayRun

GOAL_TOKENS = 0.55  # MUR total tokens / Per-Step Scale's
GOAL_OVERHEAD = 1.05  # graph wall time / direct replay's
GOAL_SCALING = 0.8  # graph tokens/s / raw batched tokens/s, at GOAL_SCALING_FROM and above
GOAL_SCALING_FROM = 8


def fmt(value: float | int | None, digits: int = 1) -> str:
    """A table cell: thousands separators, fixed digits, '-' for missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


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


def dict_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of rows given as {header: cell}, each header beside its cell: the
    headers are the first row's (there must be one), a cell a later row lacks is empty."""
    headers = list(rows[0])
    return markdown_table(headers, ([row.get(h, "") for h in headers] for row in rows))


def verdict(value: float | None, goal: float, *, at_most: bool) -> str:
    """'met' / 'missed' for a ratio against its goal."""
    if value is None:
        return "not measured"
    ok = value <= goal if at_most else value >= goal
    return "met" if ok else "missed"


def economy_table(runs: Sequence[GraphRun]) -> tuple[str, list[str]]:
    """Table 1 and one goal line per strategy."""
    by_key = {(r.strategy, r.gate): r for r in runs}
    rows, goals = [], []
    for r in runs:
        always, never = by_key.get((r.strategy, "always")), by_key.get((r.strategy, "never"))
        vs_never = ratio(r.total_tokens, never.total_tokens if never else None)
        rows.append(
            {
                "strategy": r.strategy,
                "gate": r.gate,
                "questions": r.questions,
                "backbone tok": fmt(r.backbone_tokens),
                "external tok": fmt(r.external_tokens),
                "total tok": fmt(r.total_tokens),
                "server tok": fmt(int(r.server.generation_tokens or 0)),
                "calls": fmt(r.calls),
                "scaled / steps": f"{r.steps_scaled} / {r.steps_total}",
                "wall s": fmt(r.wall_s),
                "tok vs always": fmt_ratio(
                    ratio(r.total_tokens, always.total_tokens if always else None)
                ),
                "tok vs never": fmt_ratio(vs_never),
            }
        )
        if r.gate in ("always", "never") or not always:
            continue
        tok = ratio(r.total_tokens, always.total_tokens)
        name = "MUR" if r.gate == "mur" else r.gate
        goals.append(
            f"- {r.strategy}, {r.gate}: {name} / always = {fmt_ratio(tok)} tokens "
            f"({fmt_ratio(ratio(r.calls, always.calls))} calls, "
            f"{fmt_ratio(ratio(r.wall_s, always.wall_s))} wall); {name} / never = "
            f"{fmt_ratio(vs_never)} tokens. Goal <= {GOAL_TOKENS:.2f}x: "
            f"**{verdict(tok, GOAL_TOKENS, at_most=True)}** (scaled {r.steps_scaled} of "
            f"{r.steps_total} steps; by step index "
            + ", ".join(f"t={t}: {s}/{n}" for t, (s, n) in sorted(r.scaled_by_step.items()))
            + ")"
        )
    return dict_table(rows), goals


OVERHEAD_HEADER = [
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
]


def overhead_table(pairs: Sequence[tuple[GraphRun, ReplayRun]]) -> tuple[str, list[str]]:
    """Table 2 and its goal lines: each graph run against its replay, and all of them pooled
    (BENCHMARKS.md's notes say what each column measures)."""
    rows: list[list[Any]] = [_overhead_row(graph, replay) for graph, replay in pairs]
    goals: list[str] = []
    if pairs:
        pooled, goals = _overhead_pooled(pairs)
        rows.append(pooled)
    return markdown_table(OVERHEAD_HEADER, rows), goals


def _overhead_row(graph: GraphRun, replay: ReplayRun) -> list[Any]:
    client = graph.client
    return [
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
        fmt_ratio(speed_normalized(graph.wall_s, graph.server, replay.wall_s, replay.server)),
        f"{fmt(graph.cpu_s, 1)} / {fmt(replay.cpu_s, 1)}",
        f"{fmt(int(graph.server.generation_tokens or 0))} / "
        f"{fmt(int(replay.server.generation_tokens or 0))}",
    ]


def _overhead_pooled(pairs: Sequence[tuple[GraphRun, ReplayRun]]) -> tuple[list[Any], list[str]]:
    """The pooled row of Table 2 and its two goal lines."""
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
    share = fmt(100 * between / spans if spans else None, 2)
    row = [
        "**all runs pooled**",
        sum(g.questions for g, _ in pairs),
        "",
        sum(r.requests for _, r in pairs),
        fmt(graph_wall, 1),
        fmt(replay_wall, 1),
        fmt_ratio(wall_ratio),
        share,
        "",
        fmt_ratio(client_ratio),
        "",
        fmt_ratio(pooled_normalized),
        "",
        "",
    ]
    goals = [
        f"- Pooled graph / replay wall time = {fmt_ratio(wall_ratio)} (per run "
        + ", ".join(fmt_ratio(ratio(g.wall_s, r.wall_s)) for g, r in pairs)
        + f"). Goal <= {GOAL_OVERHEAD:.2f}x: "
        f"**{verdict(wall_ratio, GOAL_OVERHEAD, at_most=True)}**. With each side's wall "
        "time counted in the server's own time per token during it (the machine's load "
        f"changes between the two): {fmt_ratio(pooled_normalized)} "
        f"(**{verdict(pooled_normalized, GOAL_OVERHEAD, at_most=True)}**).",
        f"- The orchestration's own share of the critical path: {share}% "
        f"of question time is spent between requests, i.e. graph / replay = "
        f"{fmt_ratio(client_ratio)} from the client alone "
        f"(**{verdict(client_ratio, GOAL_OVERHEAD, at_most=True)}**).",
    ]
    return row, goals


def scaling_table(pairs: Sequence[tuple[GraphRun, RawRun]]) -> tuple[str, list[str]]:
    """Table 3 and its goal lines (levels at and above GOAL_SCALING_FROM): tok/s, which the
    machine's load moves, and batch fill, which it does not."""
    rows, goals = [], []
    for graph, raw in pairs:
        window = ratio(graph.window_tokens_per_s, raw.tokens_per_s)
        whole = ratio(graph.tokens_per_s, raw.tokens_per_s)
        graph_batch = graph.window.sequences_per_step if graph.window else None
        batch = ratio(graph_batch, raw.server.sequences_per_step)
        window_step = graph.window.inter_token_s if graph.window else None
        rows.append(
            {
                "in flight": graph.concurrency,
                "questions": graph.questions,
                "graph tok/s (window)": fmt(graph.window_tokens_per_s),
                "graph tok/s (whole run)": fmt(graph.tokens_per_s),
                "raw tok/s": fmt(raw.tokens_per_s),
                "graph / raw (window)": fmt_ratio(window),
                "graph / raw (whole run)": fmt_ratio(whole),
                "sequences per engine step graph / raw": f"{fmt(graph_batch, 2)} / "
                f"{fmt(raw.server.sequences_per_step, 2)}",
                "batch fill graph / raw": fmt_ratio(batch),
                "server ms / token graph / raw": f"{fmt_ms(window_step)} / "
                f"{fmt_ms(raw.server.inter_token_s)}",
                "client CPU % of a core": fmt(
                    100 * graph.cpu_s / graph.wall_s if graph.wall_s else None, 1
                ),
            }
        )
        if graph.concurrency >= GOAL_SCALING_FROM:
            goals.append(
                f"- {graph.concurrency} questions in flight: graph / raw = {fmt_ratio(window)} "
                f"tok/s while every slot is busy ({fmt_ratio(whole)} over the whole run, drain "
                f"included). Goal >= {GOAL_SCALING:.2f}x: "
                f"**{verdict(window, GOAL_SCALING, at_most=False)}**. Batch fill, graph / raw "
                f"= {fmt_ratio(batch)} (**{verdict(batch, GOAL_SCALING, at_most=False)}**)."
            )
    return dict_table(rows), goals


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
