"""`mur bench formats`: each weight format of a CPU profile served in turn on this machine, on
the project's real load.

For every format (`servers.processes.weights`) the profile's server is started alone, then:
the server's decode rate with 1, 8 and 32 questions in flight through the step loop (gate
never, top-20 logprobs, MATH-500 prompts: prefills of new steps mixed in as in the experiments),
read from its generation counter over a window after a warm-up; and the wait for one question
alone. Formats give different tokens, so the alone rows give the time and the tokens both. A
format the CPU's vLLM cannot serve is a row saying so with the server's reason.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mur.evals.questions import load_dataset
from mur.graphs.mur import build_graph
from mur.graphs.state import Context
from mur.servers.clients.chat_models import make_chat_model
from mur.servers.clients.errors import ServerError
from mur.servers.clients.metrics import generation_tokens
from mur.servers.processes.facts import server_facts
from mur.servers.processes.launcher import down, status, up
from mur.servers.processes.profiles import get_profile

STREAMS = (1, 8, 32)
BENCH_PORT = 8090  # its own port and record name: an experiment's server is never reused


@dataclass
class FormatRun:
    """One format's measurements (or why it did not serve)."""

    weights: str
    server: dict[str, Any] | None = None
    failed: str | None = None
    rates: dict[int, float] = field(default_factory=dict)
    """Streams -> generated tokens a second (the server's counter over the window)."""
    alone_s: list[float] = field(default_factory=list)
    alone_tokens: list[int] = field(default_factory=list)


async def _load(graph: Any, questions: Sequence[Any], settings: dict[str, Any], streams: int,
                url: str, warmup: float, window: float) -> float:  # fmt: skip
    """Tokens a second the server generates with `streams` questions in flight."""
    cycle = itertools.cycle(questions)

    async def worker() -> None:
        while True:
            await graph.ainvoke({"question": next(cycle).question}, context=Context(**settings))

    tasks = [asyncio.create_task(worker()) for _ in range(streams)]
    try:
        await asyncio.sleep(warmup)
        before, start = generation_tokens(url), time.perf_counter()
        await asyncio.sleep(window)
        return (generation_tokens(url) - before) / (time.perf_counter() - start)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def measure(weights: str, args: argparse.Namespace) -> FormatRun:
    run = FormatRun(weights)
    base = get_profile(args.profile)
    profile = replace(base, name=f"bench-{weights}", port=args.port, weights=weights)
    try:  # up() makes the format's folder first if it is missing (untimed)
        server = up(profile, eager=args.eager, timeout=args.timeout)
    except ServerError as exc:
        run.failed = reason(exc)
        return run
    try:
        backbone = make_chat_model(server.base_url, server.model)
        run.server = server_facts(server.base_url, server.model).as_json()
        graph = build_graph(backbone=backbone)
        settings = {**base.recommended, "strategy": "critic", "gate": "never", "top_logprobs": 20}
        questions = load_dataset("math500", limit=args.questions, offset=args.offset)
        for streams in STREAMS:
            run.rates[streams] = await _load(
                graph, questions, settings, streams, server.base_url, args.warmup, args.window
            )
            print(f"{weights}: {streams} streams {run.rates[streams]:.1f} tok/s", file=sys.stderr)
        for question in questions[: args.alone]:
            start = time.perf_counter()
            output = await graph.ainvoke(
                {"question": question.question}, context=Context(**settings)
            )
            run.alone_s.append(time.perf_counter() - start)
            run.alone_tokens.append(output["usage"]["backbone_tokens"])
            print(f"{weights}: {question.id} alone {run.alone_s[-1]:.1f} s", file=sys.stderr)
    finally:
        if server.started:
            down(profile.name)
    return run


def reason(exc: BaseException) -> str:
    """A failure in one table cell: its first line, and its last (where a quoted log or
    traceback ends in the cause) when there are more."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else type(exc).__name__
    return f"{lines[0]} ... {lines[-1]}"


def table(runs: Sequence[FormatRun]) -> str:
    """Per format: tok/s at each stream count, the wait for one question alone, and the
    ratios to the first format that served."""
    head = " | ".join(f"{s} stream{'s' if s > 1 else ''} tok/s" for s in STREAMS)
    lines = [
        f"| format | {head} | alone s / question | alone tokens / question | alone tok/s | "
        "vs first (1 / 8 / 32 streams) |",
        "|---|" + "---|" * (len(STREAMS) + 4),
    ]
    first = next((r for r in runs if r.failed is None), None)
    for r in runs:
        if r.failed is not None:
            lines.append(f"| {r.weights} | does not serve here: {r.failed} |")
            continue
        assert first is not None
        rates = " | ".join(f"{r.rates[s]:.1f}" for s in STREAMS)
        wait, tokens = statistics.fmean(r.alone_s), statistics.fmean(r.alone_tokens)
        ratios = " / ".join(
            f"{r.rates[s] / first.rates[s]:.2f}x" if first.rates[s] else "-" for s in STREAMS
        )
        lines.append(
            f"| {r.weights} | {rates} | {wait:.1f} | {tokens:,.0f} | "
            f"{sum(r.alone_tokens) / sum(r.alone_s):.1f} | {ratios} |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace, prog: str) -> int:
    """Every format in turn, alone on the cores (2 when other servers share them); the
    table, and --out's JSON."""
    busy = [s for s in status() if s.healthy]
    if busy:
        names = ", ".join(f"{s.profile} ({s.base_url})" for s in busy)
        print(
            f"{prog}: other servers share the cores and would void the figures: {names}; stop "
            "them first (`mur servers down --all`)",
            file=sys.stderr,
        )
        return 2
    runs = [await measure(weights, args) for weights in args.formats]
    shown = table(runs)
    facts = next((r.server for r in runs if r.server), None)
    if facts:
        print(f"{facts['cpu']}, flags {' '.join(facts['cpu_flags'])}; vLLM "
              f"{facts['vllm_version']}, {facts['dtype']}")  # fmt: skip
    print(shown)
    if args.out:
        document = {"runs": [asdict(r) for r in runs], "table": shown}
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0
