"""`mur bench economy`: MUR's token economy and the orchestration's speed, side by
side, against one vLLM server; writes the tables to BENCHMARKS.md (its notes are kept). How
each is measured, and what the last run's numbers mean, is in BENCHMARKS.md's notes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai

from mur.benchmarks.counters import parse_block_size
from mur.benchmarks.measure import Bench, Server, Settings
from mur.benchmarks.report import load_line, machine_line, merge_notes, render
from mur.benchmarks.results import GraphRun, RawRun, ReplayRun
from mur.benchmarks.tables import fmt
from mur.evals.questions import load_dataset
from mur.servers.clients.chat_models import resolve_model
from mur.servers.processes.facts import vllm_version
from mur.servers.processes.launcher import up
from mur.servers.processes.profiles import get_profile

BENCH_PROFILE = "cpu-tiny"  # the server started (or reused) when no --base-url is given


def connect(args: argparse.Namespace) -> tuple[str, str, str]:
    """(base_url, model, description) of the server under test, started if needed."""
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
    out: dict[str, Any] = {"version": vllm_version(bench.server.base_url, timeout=60) or "?"}
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
    # Local: pyinstrument is an optional tool (pip install pyinstrument), not a dependency; at
    # the top, every `mur bench economy` would fail without it.
    from pyinstrument import Profiler  # noqa: PLC0415

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


def run(args: argparse.Namespace, graph: dict[str, Any], command: str) -> int:
    """Run the four measurements and write their tables under a header naming `command`."""
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
    except (httpx.HTTPError, openai.APIConnectionError) as exc:
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
