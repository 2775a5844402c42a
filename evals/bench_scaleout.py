"""`python -m evals.bench_scaleout`: MUR throughput on one vLLM CPU server vs two behind the router.

The same benchmark load (the first N MATH-500 questions, one strategy and gate, small settings,
N questions in flight) runs against:

- one: one server computing on every core (`VLLM_CPU_OMP_THREADS_BIND=0-1`);
- two: two servers, each pinned to its own core (`0` and `1`), behind `servers.router`.

Both cases use the same cores, so the ratio shows what splitting one machine into replicas buys
(or costs); on a GPU host each replica would bring its own GPU. The servers are this script's
own (profile cpu-tiny renamed, ports 8031/8032 by default), started and stopped here. Tokens
come from the graph's own accounting and are checked against the servers' counters; tokens
generated meanwhile by other servers recorded on this machine, and the share of the CPU other
processes used, are reported next to each measurement (the script first waits for a quiet
machine). The servers' records and logs live in a private MUR_HOME (`--home`), so a
`python -m servers down --all` elsewhere cannot stop them mid-measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

GIB = 1024**3
NEED_GIB = 12  # two ~5 GiB servers plus headroom for everyone else
WAIT_S, WAIT_MAX_S = 60, 20 * 60
SMALL_SETTINGS: dict[str, int] = {"max_steps": 6, "max_step_tokens": 96, "judge_max_tokens": 64}


@dataclass
class Phase:
    """One measured run of the load against a set of servers."""

    case: str
    servers: int
    binding: str
    wall_s: float = 0.0
    finished: int = 0
    failed: int = 0
    graph_tokens: int = 0
    server_tokens: float | None = None
    llm_calls: int = 0
    served: list[int] = field(default_factory=list)
    others_tokens: float = 0.0
    """Tokens other servers on this machine generated during the phase (CPU competition)."""
    others_cpu: float | None = None
    """Share of the machine's CPU time used by processes not of this benchmark."""
    errors: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.graph_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def questions_per_min(self) -> float:
        return self.finished / self.wall_s * 60 if self.wall_s else 0.0


def available_gib() -> float:
    """MemAvailable from /proc/meminfo, in GiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GIB
    return 0.0


def wait_for_memory(need_gib: float) -> None:
    """Servers die at start without RAM: wait (someone may be benchmarking) or give up."""
    deadline = time.monotonic() + WAIT_MAX_S
    while (have := available_gib()) < need_gib:
        if time.monotonic() >= deadline:
            raise SystemExit(f"only {have:.1f} GiB available after {WAIT_MAX_S} s of waiting")
        print(f"{have:.1f} GiB available, need {need_gib}: waiting {WAIT_S} s", file=sys.stderr)
        time.sleep(WAIT_S)


def wait_for_quiet(max_share: float, own: frozenset[int] = frozenset()) -> None:
    """Measure on a quiet machine: wait while other processes use more than `max_share` of
    the CPU (sampled over 10 s), up to WAIT_MAX_S; then go on and let the table show it."""
    deadline = time.monotonic() + WAIT_MAX_S
    while True:
        sample = CpuShare(set(own))
        time.sleep(10)
        share = sample.others()
        if share <= max_share:
            return
        if time.monotonic() >= deadline:
            print(f"others still use {share:.0%} of the CPU: measuring anyway", file=sys.stderr)
            return
        print(f"others use {share:.0%} of the CPU: waiting {WAIT_S} s", file=sys.stderr)
        time.sleep(WAIT_S)


def other_servers_tokens(own_urls: Sequence[str]) -> dict[str, float]:
    """Generation counters of every other recorded server (to see who competed for the CPU)."""
    from servers.launcher import status
    from servers.metrics import generation_tokens

    counts = {}
    for server in status(probe=lambda _: True):
        if server.base_url in own_urls:
            continue
        try:
            counts[server.base_url] = generation_tokens(server.base_url)
        except Exception:  # a server going away is not our concern here
            continue
    return counts


def _busy_ticks() -> int:
    """CPU time spent by the whole machine (all cores, not idle), in clock ticks."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return user + nice + system + irq + softirq + steal


def _group_ticks(pgids: set[int]) -> int:
    """CPU time of every process in the given process groups (our servers), in clock ticks."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) in pgids:
            total += int(fields[11]) + int(fields[12])
    return total


class CpuShare:
    """How much of the machine's CPU went to processes outside this benchmark meanwhile."""

    def __init__(self, server_pgids: set[int]) -> None:
        self.pgids = server_pgids
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        tick = os.sysconf("SC_CLK_TCK")
        mine = os.times()
        return (
            time.monotonic(),
            _busy_ticks() / tick,
            _group_ticks(self.pgids) / tick + mine.user + mine.system,
        )

    def others(self) -> float:
        """Others' CPU seconds / (wall seconds x cores) since construction."""
        wall, busy, ours = (b - a for a, b in zip(self.start, self._sample(), strict=True))
        return max(busy - ours, 0.0) / (wall * (os.cpu_count() or 1))


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


def profiles_for(case: str, ports: Sequence[int]) -> list[Any]:
    """cpu-tiny renamed onto our own ports, with the core binding the case calls for."""
    from servers.profiles import get_profile

    base = get_profile("cpu-tiny")

    def pinned(index: int, cores: str) -> Any:
        env = {**base.env, "VLLM_CPU_OMP_THREADS_BIND": cores}
        return replace(base, name=f"cpu-r{index + 1}", port=ports[index], env=env)

    if case == "one":
        return [pinned(0, "0-1")]
    return [pinned(0, "0"), pinned(1, "1")]


async def warm_up(model: Any, replicas: int) -> None:
    """A few short requests per replica first, so start-up costs stay out of the timing."""
    from langchain_core.messages import HumanMessage

    prompt = [HumanMessage("Count from 1 to 20.")]
    await asyncio.gather(*(model.ainvoke(prompt, max_tokens=24) for _ in range(4 * replicas)))


async def run_load(
    model: Any, problems: Sequence[Any], args: argparse.Namespace, phase: Phase
) -> None:
    """The benchmark load: every question through the graph, `concurrency` in flight."""
    from graphs.mur import build_graph
    from graphs.state import Context

    graph = build_graph(args.strategy, backbone=model)
    context = Context(gate=args.gate, gamma=args.gamma, **SMALL_SETTINGS)
    limit = asyncio.Semaphore(args.concurrency)

    async def one(problem: Any) -> None:
        async with limit:
            try:
                result = await graph.ainvoke(
                    {"question": problem.question, "system_prompt": problem.system_prompt},
                    context=context,
                )
            except Exception as exc:  # counted and shown; the others go on
                phase.failed += 1
                phase.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                return
        usage = result["usage"]
        phase.finished += 1
        phase.graph_tokens += usage["backbone_tokens"] + usage["external_tokens"]
        phase.llm_calls += usage["llm_calls"]

    begin = time.monotonic()
    await asyncio.gather(*(one(p) for p in problems))
    phase.wall_s = time.monotonic() - begin


def measure(case: str, problems: Sequence[Any], args: argparse.Namespace) -> Phase:
    """Start the case's servers, warm them, run the load once, stop them."""
    from servers.launcher import down, up
    from servers.metrics import generation_tokens
    from servers.model import ensure_default_model
    from servers.router import make_routed_model

    specs = profiles_for(case, args.ports)  # env (VLLM_CACHE_ROOT) from the shared MUR_HOME
    model_path = ensure_default_model()
    phase = Phase(case, len(specs), " + ".join(p.env["VLLM_CPU_OMP_THREADS_BIND"] for p in specs))
    wait_for_memory(NEED_GIB)
    wait_for_quiet(args.max_others_cpu)  # a compiled start takes 2 min alone, 15+ when shared
    try:
        pgids = set()
        for spec in specs:
            print(f"[{case}] starting {spec.name} on :{spec.port} ...", file=sys.stderr)
            with private_home(args.home):
                server = up(
                    spec,
                    eager=args.eager,
                    timeout=args.start_timeout,
                    progress=False,
                    model_path=model_path,
                )
            if not server.started:
                raise SystemExit(f"port {spec.port} already serves something: pick --ports")
            pgids.add(server.pid)
        urls = [spec.base_url for spec in specs]
        model = make_routed_model(urls)
        asyncio.run(warm_up(model, len(urls)))
        wait_for_quiet(args.max_others_cpu, frozenset(pgids))
        before = sum(generation_tokens(url) for url in urls)
        others_before = other_servers_tokens(urls)
        if hasattr(model, "served"):
            start_served = model.served
        print(f"[{case}] running {len(problems)} questions ...", file=sys.stderr)
        cpu = CpuShare(pgids)
        asyncio.run(run_load(model, problems, args, phase))
        phase.others_cpu = cpu.others()
        phase.server_tokens = sum(generation_tokens(url) for url in urls) - before
        others_after = other_servers_tokens(urls)
        phase.others_tokens = sum(
            others_after[url] - others_before[url] for url in others_after if url in others_before
        )
        if hasattr(model, "served"):
            phase.served = [
                now - then for now, then in zip(model.served, start_served, strict=True)
            ]
        else:
            phase.served = [phase.llm_calls]
    finally:
        with private_home(args.home):
            for spec in specs:
                down(spec.name)
    return phase


def table(phases: Sequence[Phase]) -> str:
    """Markdown table of the phases, then the two/one ratios."""
    head = (
        "| case | servers | cores bound | questions | wall s | tokens | tok/s | q/min "
        "| server tokens | requests per replica | others' CPU share | others' tokens |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"
    )
    rows = [
        f"| {p.case} | {p.servers} | {p.binding} | {p.finished}"
        f"{f' ({p.failed} failed)' if p.failed else ''} | {p.wall_s:.1f} | {p.graph_tokens:,} "
        f"| {p.tokens_per_s:.1f} | {p.questions_per_min:.1f} "
        f"| {p.server_tokens:,.0f} | {' / '.join(map(str, p.served))} "
        f"| {'-' if p.others_cpu is None else f'{p.others_cpu:.0%}'} | {p.others_tokens:,.0f} |"
        for p in phases
    ]
    lines = [head, *rows]
    ones = [p for p in phases if p.case == "one"]
    twos = [p for p in phases if p.case == "two"]
    if ones and twos:
        one_tps = sum(p.graph_tokens for p in ones) / sum(p.wall_s for p in ones)
        two_tps = sum(p.graph_tokens for p in twos) / sum(p.wall_s for p in twos)
        one_qpm = sum(p.finished for p in ones) / sum(p.wall_s for p in ones) * 60
        two_qpm = sum(p.finished for p in twos) / sum(p.wall_s for p in twos) * 60
        lines.append(
            f"\nThroughput two / one: **{two_tps / one_tps:.2f}x** tokens/s "
            f"({two_tps:.1f} vs {one_tps:.1f}), {two_qpm / one_qpm:.2f}x questions/min."
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m evals.bench_scaleout",
        description="MUR throughput: one vLLM CPU server vs two behind servers.router.",
    )
    parser.add_argument("--questions", type=int, default=16, help="first N MATH-500 questions")
    parser.add_argument("--strategy", default="critic")
    parser.add_argument("--gate", default="mur")
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--concurrency", type=int, default=8, help="questions in flight")
    parser.add_argument("--rounds", type=int, default=1, help="one/two measurements each")
    parser.add_argument(
        "--ports",
        type=lambda s: [int(p) for p in s.split(",")],
        default=[8031, 8032],
        help="two ports for this script's own servers",
    )
    parser.add_argument(
        "--max-others-cpu",
        type=float,
        default=0.2,
        help="wait (up to 20 min) until other processes use at most this share of the CPU",
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="MUR_HOME for this script's server records and logs (default: <MUR_HOME>/scaleout)",
    )
    parser.add_argument("--data-dir", help="benchmark data folder (default: ../shared/data)")
    parser.add_argument("--eager", action="store_true", help="start the servers eager")
    parser.add_argument(
        "--start-timeout", type=float, default=1800, help="seconds a server may take to start"
    )
    parser.add_argument("--json", dest="json_out", help="also write the phases to this file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from servers.paths import mur_home

    args.home = args.home or mur_home() / "scaleout"
    from evals.datasets import load_dataset

    problems = load_dataset("math500", args.data_dir, limit=args.questions)
    phases = []
    for _ in range(args.rounds):
        for case in ("one", "two"):
            phases.append(measure(case, problems, args))
            print(table(phases[-1:]), file=sys.stderr)
    command = "python -m evals.bench_scaleout " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    print(
        f"{command}\n{len(problems)} MATH-500 questions, strategy {args.strategy}, gate "
        f"{args.gate} (gamma {args.gamma}), concurrency {args.concurrency}, "
        f"{', '.join(f'{k}={v}' for k, v in SMALL_SETTINGS.items())}, "
        f"{'eager' if args.eager else 'compiled'} cpu-tiny servers, {os.cpu_count()} cores\n"
    )
    print(table(phases))
    for phase in phases:
        for error in phase.errors[:3]:
            print(f"{phase.case}: {error}", file=sys.stderr)
    if args.json_out:
        data = [{**asdict(p), "tokens_per_s": p.tokens_per_s} for p in phases]
        Path(args.json_out).write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
