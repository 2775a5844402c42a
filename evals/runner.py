"""The benchmark runner: every (gate, gamma, sample) on the same questions, concurrently,
each finished question appended to records.jsonl at once; a rerun finishes the rest."""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from evals.datasets import Problem
from evals.grading import grade
from evals.records import JobKey, RecordStore
from evals.report import write_report
from graphs.mur import build_graph
from graphs.state import Context
from nodes.llm import is_transient
from servers.sessions import new_session_id, session

# Gates whose decisions depend on gamma; the others run once, whatever the gamma list.
GAMMA_GATES = frozenset({"mur"})


@dataclass(frozen=True)
class RunOutcome:
    finished: int
    failed: int
    skipped: int
    server_gone: str | None  # why the run gave up early, if it did


@dataclass(frozen=True)
class Job:
    key: JobKey
    problem: Problem
    context: Context


Budget = tuple[str, float]  # ("budget_tokens" | "target_scale_rate", value)
BUDGET_LABELS = {"budget_tokens": "budget", "target_scale_rate": "rate"}


def budget_label(budget: Budget) -> str:
    """How a budget-mode run of the mur gate is named in records and tables."""
    return f"mur[{BUDGET_LABELS[budget[0]]}={budget[1]:g}]"


def plan_jobs(
    problems: Sequence[Problem],
    strategy: str,
    gates: Sequence[str],
    gammas: Sequence[float],
    samples: int,
    make_context: Callable[[str, float, int, Budget | None], Context],
    budgets: Sequence[Budget] = (),
) -> list[Job]:
    """The cross product, with gamma-blind gates run once (their gamma recorded as None) and
    each budget-mode variant as a gate of its own (`mur[budget=B]`, `mur[rate=r]`)."""
    settings: list[tuple[str, float | None, Budget | None]] = []
    for gate in gates:
        for gamma in gammas if gate in GAMMA_GATES else [None]:
            settings.append((gate, gamma, None))
    settings += [(budget_label(budget), None, budget) for budget in budgets]
    jobs: list[Job] = []
    for problem in problems:
        for label, gamma, budget in settings:
            gate = "mur" if budget else label
            for sample in range(samples):
                context = make_context(
                    gate, gamma if gamma is not None else gammas[0], sample, budget
                )
                key = JobKey(problem.dataset, problem.id, strategy, label, gamma, sample)
                jobs.append(Job(key, problem, context))
    return jobs


def make_record(
    job: Job, result: dict[str, Any], correct: bool, latency_s: float
) -> dict[str, Any]:
    steps = result["steps"]
    trace = {k: v for k, v in result.items() if k != "question"}  # questions stay in datasets
    return {
        "key": job.key.text,
        "dataset": job.key.dataset,
        "problem_id": job.key.problem_id,
        "strategy": job.key.strategy,
        "gate": job.key.gate,
        "gamma": job.key.gamma,
        "sample": job.key.sample,
        "gold": job.problem.answer,
        "answer": result["answer"],
        "correct": correct,
        "usage": result["usage"],
        "steps_total": len(steps),
        "steps_scaled": sum(1 for s in steps if s["scaled"]),
        "finish_reason": result["finish_reason"],
        "latency_s": round(latency_s, 3),
        "trace": trace,
    }


async def run_jobs(
    graph: Any,
    jobs: Sequence[Job],
    store: RecordStore,
    *,
    concurrency: int,
    show_progress: bool = True,
    give_up_after: int | None = None,
    run_id: str | None = None,
) -> RunOutcome:
    """Run the jobs (at most `concurrency` in flight), appending each record as it finishes.

    A question that fails is recorded in errors.jsonl and the run goes on, unless
    `give_up_after` questions in a row fail on the server itself (unreachable, 5xx after the
    graph's retries): then the server is gone, and the rest is left for a rerun. Every request
    of one job carries the session id `<run_id>/<job key>` (servers.sessions), so a router in
    front of replicas keeps each job on one replica.
    """
    run_id = run_id or uuid.uuid4().hex[:8]
    limit = asyncio.Semaphore(concurrency)
    give_up_after = give_up_after or concurrency + 2
    finished = failed = 0
    consecutive_server_failures = 0
    server_gone: str | None = None
    tokens = 0
    started = time.monotonic()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=not show_progress,
        transient=False,
    )
    task = progress.add_task("questions", total=len(jobs), rate="")

    async def run_one(job: Job) -> None:
        nonlocal finished, failed, tokens, consecutive_server_failures, server_gone
        async with limit:
            if server_gone:
                return
            begin = time.monotonic()
            try:
                with session(new_session_id(run_id, job.key.text)):
                    result = await graph.ainvoke(
                        {
                            "question": job.problem.question,
                            "system_prompt": job.problem.system_prompt,
                        },
                        context=job.context,
                    )
            except Exception as exc:  # recorded with its reason; the run goes on
                failed += 1
                store.append_error(
                    {"key": job.key.text, "error": type(exc).__name__, "message": str(exc)[:2000]}
                )
                progress.advance(task)
                consecutive_server_failures = (
                    consecutive_server_failures + 1 if is_transient(exc) else 0
                )
                if consecutive_server_failures >= give_up_after:
                    server_gone = f"{type(exc).__name__}: {str(exc)[:300]}"
                return
            consecutive_server_failures = 0
            latency = time.monotonic() - begin
            # Grading may take seconds (bounded by math-verify's timeouts): off the event loop.
            correct = await asyncio.to_thread(grade, job.problem, result["answer"])
            record = make_record(job, result, correct, latency)
            store.append(record)
        finished += 1
        usage = record["usage"]
        tokens += usage["backbone_tokens"] + usage["external_tokens"]
        elapsed = max(time.monotonic() - started, 1e-9)
        progress.update(
            task,
            advance=1,
            rate=f"{finished / elapsed * 60:.1f} q/min  {tokens / elapsed:.0f} tok/s",
        )

    with progress:
        await asyncio.gather(*(run_one(job) for job in jobs))
    return RunOutcome(finished, failed, len(jobs) - finished - failed, server_gone)


def run_benchmark(
    args: Any,
    problems: Sequence[Problem],
    connection: Any,
    make_context: Callable[..., Context],
    budgets: Sequence[Budget] = (),
) -> int:
    """`run.py --dataset ...`: plan, skip what --out already holds, run, report."""
    out = Path(args.out or f"runs/{args.dataset}-{args.strategy}")
    store = RecordStore(out)
    (out / "command.txt").write_text(
        "python run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]) + "\n"
    )

    def context_for(gate: str, gamma: float, sample: int, budget: Budget | None) -> Context:
        ctx = make_context(args, gate, gamma, connection.recommended, budget)
        return Context(**{**ctx.as_dict(), "seed": ctx.seed + sample})

    jobs = plan_jobs(
        problems, args.strategy, args.gate, args.gamma, args.samples, context_for, budgets
    )
    done = store.done_keys()
    todo = [job for job in jobs if job.key.text not in done]
    print(
        f"{len(problems)} questions x {len(jobs) // max(len(problems), 1)} settings = "
        f"{len(jobs)} runs; {len(jobs) - len(todo)} already in {store.path}, {len(todo)} to go"
        + (
            f" (dropped {store.dropped_bytes} bytes of a cut-short last line)"
            if store.dropped_bytes
            else ""
        ),
        file=sys.stderr,
    )
    graph = build_graph(args.strategy, backbone=connection.backbone, verifier=connection.verifier)
    try:
        outcome = asyncio.run(run_jobs(graph, todo, store, concurrency=args.concurrency))
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: finished questions are saved in {store.path}; rerun the same "
            "command to finish the rest",
            file=sys.stderr,
        )
        return 130
    if outcome.server_gone:
        print(
            f"the model server stopped answering ({outcome.server_gone}); "
            f"{outcome.finished} runs finished and are saved in {store.path}. Start the server "
            "again and rerun the same command to finish the rest.",
            file=sys.stderr,
        )
        return 1
    report = write_report(out)
    print(report.markdown)
    print(f"records: {store.path}\nreport: {report.markdown_path}", file=sys.stderr)
    if outcome.failed:
        print(
            f"{outcome.failed} runs failed (reasons in {store.errors_path}); rerun the same "
            "command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0
