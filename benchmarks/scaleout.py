"""`mur bench scaleout`: prefix-cache hits and throughput of replicas behind vllm-router.

The same load (the first N MATH-500 questions through `evals.harness.runner`, as `mur solve
--dataset` runs them, so every request of a question carries its `X-Session-ID`) runs against
one server on every core, then two replicas of one core each behind vllm-router under each
`--policies` entry: `consistent_hash` keeps a question on one replica, `round_robin` ignores
the session. Each configuration gets fresh servers (empty prefix caches), a warm-up, one run.
The hit-rate ratio between the policies is the figure that carries to GPUs; on a 2-core
machine two replicas only split the same cores. Server records and logs live in a private
MUR_HOME (`--home`), so `mur servers down --all` elsewhere cannot stop them mid-measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
from langchain_core.messages import HumanMessage

from mur.evals.harness.plan import EvaluationPlan
from mur.evals.harness.records import RecordStore, load_records
from mur.evals.harness.run_record import total_tokens
from mur.evals.harness.runner import run_jobs
from mur.evals.questions import Problem
from mur.graphs.mur import build_graph
from mur.graphs.refine import STRATEGIES
from mur.servers.clients.chat_models import make_chat_model
from mur.servers.clients.metrics import (
    GENERATION_TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    REQUESTS_DONE,
    read_counter,
)
from mur.servers.clients.sessions import session
from mur.servers.processes.launcher import down, up
from mur.servers.processes.model import ensure_model
from mur.servers.processes.profiles import get_profile
from mur.servers.processes.replicas import down_group, replica_profile, up_replicas

GIB = 1024**3
NEED_GIB = {"one": 6.0, "two": 8.5}  # ~4.7 GiB server / two ~3.7 GiB replicas, plus headroom
WAIT_S, WAIT_MAX_S = 30, 30 * 60
SMALL_SETTINGS: dict[str, Any] = {"max_steps": 6, "max_step_tokens": 96, "judge_max_tokens": 64}
ONE = "one"


@dataclass
class Phase:
    """One measured run of the load against one configuration."""

    case: str
    cores: str
    wall_s: float = 0.0
    finished: int = 0
    failed: int = 0
    graph_tokens: int = 0
    server_tokens: float = 0.0
    queried_tokens: float = 0.0
    cached_tokens: float = 0.0
    requests: list[int] = field(default_factory=list)
    others_cpu: float | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.graph_tokens / self.wall_s if self.wall_s else 0.0


def wait_for_memory(need_gib: float) -> None:
    """Servers die at start without RAM: wait (someone may be benchmarking) or give up."""
    deadline = time.monotonic() + WAIT_MAX_S
    while (have := psutil.virtual_memory().available / GIB) < need_gib:
        if time.monotonic() >= deadline:
            raise SystemExit(f"only {have:.1f} GiB available after {WAIT_MAX_S} s of waiting")
        print(f"{have:.1f} GiB available, need {need_gib}: waiting {WAIT_S} s", file=sys.stderr)
        time.sleep(WAIT_S)


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (idle and I/O wait left out)."""
    times = psutil.cpu_times()
    busy = ("user", "nice", "system", "irq", "softirq", "steal")
    return float(sum(getattr(times, name, 0.0) for name in busy))


def _group_seconds(pgids: set[int]) -> float:
    """CPU seconds of every process in the given process groups (our servers)."""
    total = 0.0
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in pgids:
                times = proc.cpu_times()
                total += times.user + times.system
        except (psutil.Error, OSError):  # gone, or not ours to read: not one of our servers
            continue
    return total


class CpuShare:
    """The share of the machine's CPU that processes outside this benchmark used meanwhile."""

    def __init__(self, pgids: set[int]) -> None:
        self.pgids = pgids
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        mine = os.times()
        ours = _group_seconds(self.pgids) + mine.user + mine.system
        return time.monotonic(), _busy_seconds(), ours

    def others(self) -> float:
        wall, busy, ours = (b - a for a, b in zip(self.start, self._sample(), strict=True))
        return max(busy - ours, 0.0) / (wall * (os.cpu_count() or 1))


def wait_for_quiet(max_share: float, ours: set[int]) -> float:
    """Wait (up to `WAIT_MAX_S`) while other processes use more than `max_share` of the CPU,
    sampled over 10 s; returns the last share seen (the phase is measured either way and
    the table says how busy the machine was)."""
    deadline = time.monotonic() + WAIT_MAX_S
    while True:
        sample = CpuShare(ours)
        time.sleep(10)
        share = sample.others()
        if share <= max_share or time.monotonic() >= deadline:
            return share
        print(f"others use {share:.0%} of the CPU: waiting {WAIT_S} s", file=sys.stderr)
        time.sleep(WAIT_S)


@contextmanager
def private_home(home: Path) -> Iterator[None]:
    """Run records and logs under `home` meanwhile (models and compiled kernels stay shared)."""
    saved = os.environ.get("MUR_HOME")
    os.environ["MUR_HOME"] = str(home)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MUR_HOME", None)
        else:
            os.environ["MUR_HOME"] = saved


def counters(urls: Sequence[str]) -> list[dict[str, float]]:
    """The vLLM counters this benchmark reads, per server."""
    names = (GENERATION_TOKENS, PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, REQUESTS_DONE)
    return [{name: read_counter(url, name) for name in names} for url in urls]


def fill_from_counters(
    phase: Phase, before: list[dict[str, float]], after: list[dict[str, float]]
) -> None:
    """Server-side deltas over the measured window, summed over the servers."""

    def delta(name: str) -> list[float]:
        return [a[name] - b[name] for a, b in zip(after, before, strict=True)]

    phase.server_tokens = sum(delta(GENERATION_TOKENS))
    phase.queried_tokens = sum(delta(PREFIX_CACHE_QUERIES))
    phase.cached_tokens = sum(delta(PREFIX_CACHE_HITS))
    phase.requests = [round(v) for v in delta(REQUESTS_DONE)]


def start_servers(
    case: str, args: argparse.Namespace, base: Any, model_path: Path
) -> tuple[Any, ...]:
    """(client URL, replica URLs, cores per server, process group ids) for `case`."""
    how: dict[str, Any] = {"eager": args.eager, "timeout": args.start_timeout, "progress": False}
    if case == ONE:
        one = up(replace(base, name="scaleout-one", port=args.port), **how, model_path=model_path)
        cores = base.env["VLLM_CPU_OMP_THREADS_BIND"]
        return one.base_url, [one.base_url], cores, {one.pid}
    group = up_replicas(base, 2, port=args.port, policy=case, **how, model_path=model_path)
    members = [replica_profile(base, i, 2, args.port + 1 + i) for i in range(2)]
    cores = " + ".join(m.env["VLLM_CPU_OMP_THREADS_BIND"] for m in members)
    pids = {s.pid for s in [group.router, *group.replicas]}
    return group.base_url, [r.base_url for r in group.replicas], cores, pids


def stop_servers(case: str) -> None:
    if case == ONE:
        down("scaleout-one")
    else:
        down_group("scaleout")


async def warm_up(model: Any) -> None:
    """A few short requests, so start-up costs stay out of the timing."""

    async def one(index: int) -> None:
        with session(f"warm-up/{index}"):
            await model.ainvoke([HumanMessage(f"Count from 1 to {10 + index}.")], max_tokens=24)

    await asyncio.gather(*(one(i) for i in range(8)))


def load_plan(problems: Sequence[Problem], args: argparse.Namespace) -> EvaluationPlan:
    """The benchmark load as the runner's plan: one strategy and gate label at one gamma, the
    small settings, one sample per question."""
    return EvaluationPlan(
        dataset="math500",
        strategy=args.strategy,
        problems=tuple(problems),
        gates=(args.gate,),
        gammas=(args.gamma,),
        concurrency=args.concurrency,
        settings=SMALL_SETTINGS,
    )


def run_load(url: str, problems: Sequence[Problem], args: argparse.Namespace, phase: Phase) -> None:
    """The benchmark load through `evals.harness.runner`, as `mur solve --dataset` runs it; the
    records (full traces) stay in `<home>/runs/<case>` for a look afterwards."""
    plan = load_plan(problems, args)
    graph = build_graph(backbone=make_chat_model(url))
    folder = args.home / "runs" / phase.case
    shutil.rmtree(folder, ignore_errors=True)  # a fresh run each time, never resumed
    store = RecordStore(folder)
    begin = time.monotonic()
    outcome = asyncio.run(
        run_jobs(graph, plan.jobs(), store, concurrency=args.concurrency, show_progress=False)
    )
    phase.wall_s = time.monotonic() - begin
    records = load_records(folder)
    if store.errors_path.exists():
        errors = store.errors_path.read_text().splitlines()
        phase.errors = [json.loads(line)["message"][:200] for line in errors[:3]]
    phase.finished, phase.failed = outcome.finished, outcome.failed
    phase.graph_tokens = sum(total_tokens(r) for r in records)


def describe_plan(
    cases: Sequence[str], problems: Sequence[Problem], args: argparse.Namespace
) -> str:
    """What a run would measure, without starting anything (`--dry-run`); raises ValueError
    for an unknown strategy or a bad gate label or setting."""
    STRATEGIES.check(args.strategy)
    plan = load_plan(problems, args)
    jobs = plan.jobs()
    context = jobs[0].context
    shown = {
        "gate": context.gate,
        "gamma": context.gamma,
        **context.model_dump(exclude_defaults=True),
    }
    return "\n".join(
        [
            f"{len(jobs)} runs per configuration ({len(problems)} MATH-500 questions, strategy "
            f"{plan.strategy}, gate {args.gate}, {plan.concurrency} in flight), each with "
            f"{shown}",
            *(f"- {label(case)}" for case in cases),
            f"records under {args.home / 'runs'}",
        ]
    )


def measure(case: str, problems: Sequence[Problem], args: argparse.Namespace) -> Phase:
    """Start the case's servers, run the load once on them, stop them."""
    base = replace(get_profile("cpu-tiny"), name="scaleout")  # VLLM_CACHE_ROOT stays shared
    assert base.package is not None
    # in the shared MUR_HOME, converted once
    model_path = ensure_model(base.package, weights=base.weights)
    wait_for_memory(NEED_GIB["one" if case == ONE else "two"])
    with private_home(args.home):
        print(f"[{case}] starting servers ...", file=sys.stderr)
        try:
            url, replica_urls, cores, pids = start_servers(case, args, base, model_path)
            phase = Phase(case, cores)
            asyncio.run(warm_up(make_chat_model(url)))  # outside the counted window
            wait_for_quiet(args.max_others_cpu, pids)
            before = counters(replica_urls)
            cpu = CpuShare(pids)
            print(f"[{case}] running {len(problems)} questions ...", file=sys.stderr)
            run_load(url, problems, args, phase)
            phase.others_cpu = cpu.others()
            fill_from_counters(phase, before, counters(replica_urls))
        finally:
            stop_servers(case)
    return phase


def label(case: str) -> str:
    if case == ONE:
        return "one server"
    session = " + session header" if case == "consistent_hash" else " (session ignored)"
    return f"2 replicas, {case}{session}"


def table(phases: Sequence[Phase]) -> str:
    """Markdown table of the phases, then the ratios that matter."""
    lines = [
        "| configuration | cores | questions | wall s | tokens | tok/s | prefix-cache hit rate "
        "| cached / queried prompt tokens | requests per server | others' CPU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for p in phases:
        failed = f" ({p.failed} failed)" if p.failed else ""
        others = "-" if p.others_cpu is None else f"{p.others_cpu:.0%}"
        lines.append(
            f"| {label(p.case)} | {p.cores} | {p.finished}{failed} | {p.wall_s:.1f} "
            f"| {p.graph_tokens:,} | {p.tokens_per_s:.1f} | {p.hit_rate:.1%} "
            f"| {p.cached_tokens:,.0f} / {p.queried_tokens:,.0f} "
            f"| {' / '.join(map(str, p.requests))} | {others} |"
        )
    by_case = {p.case: p for p in phases}
    sticky, ones = by_case.get("consistent_hash"), by_case.get(ONE)
    for case, other in by_case.items():
        if sticky and case not in (ONE, "consistent_hash") and other.hit_rate:
            lines.append(
                f"\nHit rate consistent_hash / {case}: **{sticky.hit_rate / other.hit_rate:.2f}x** "
                f"({sticky.hit_rate:.1%} vs {other.hit_rate:.1%}); tok/s "
                f"{sticky.tokens_per_s / other.tokens_per_s:.2f}x."
            )
    if ones and ones.tokens_per_s:
        for case, other in by_case.items():
            if case != ONE:
                lines.append(
                    f"Throughput {case} / one server: {other.tokens_per_s / ones.tokens_per_s:.2f}x"
                    f" tok/s."
                )
    return "\n".join(lines)
