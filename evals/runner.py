"""The benchmark runner: every (gate, gamma, sample) on the same questions, concurrently,
each finished question appended to records.jsonl at once; a rerun finishes the rest."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from evals.checkpoints import Solved, forget, open_checkpoints, solve_resumable
from evals.datasets import Problem
from evals.grading import grade
from evals.progress import RunProgress
from evals.records import JobKey, RecordStore, SettingsMismatchError
from evals.report import write_report
from evals.stopping import STOPPED_EXIT, StopSignals
from graphs.mur import build_graph
from graphs.state import Context
from nodes.gate_labels import budget_label, is_budget_label, parse_gate_label
from nodes.usage import CallMeter, metered
from servers.sessions import new_session_id, session
from servers.transport_errors import is_transient

# Gates whose decisions depend on gamma; the others run once, whatever the gamma list.
GAMMA_GATES = frozenset({"mur"})


@dataclass(frozen=True)
class RunOutcome:
    finished: int
    failed: int
    skipped: int
    server_gone: str | None  # why the run gave up early, if it did
    stopped_by: str | None = None  # the signal (SIGINT, SIGTERM) that stopped it early


@dataclass(frozen=True)
class Job:
    key: JobKey
    problem: Problem
    context: Context


Budget = tuple[str, float]  # ("budget_tokens" | "target_scale_rate", value)
Overrides = dict[str, Any]  # Context fields a setting sets on top of the run's


def model_name(model: BaseChatModel) -> str:
    """The served model name a chat model asks for (its class name when it has none)."""
    return str(getattr(model, "model_name", None) or type(model).__name__)


Variant = tuple[str, str, float | None, Overrides]  # label, gate, gamma, overrides


def gate_variants(gates: Sequence[str], gammas: Sequence[float]) -> list[Variant]:
    """The settings gate labels ask for: a gamma gate once per gamma, the others and budget
    mode (whose gamma adapts) once, their gamma None."""
    variants: list[Variant] = []
    for label in gates:
        gate, overrides = parse_gate_label(label)
        once = gate not in GAMMA_GATES or is_budget_label(label)
        for gamma in [None] if once else gammas:
            variants.append((label, gate, gamma, overrides))
    return variants


@dataclass(frozen=True)
class BenchmarkPlan:
    """One benchmark, typed: every (gate, gamma, budget, sample) on the same questions.

    `gates` are gate labels (`mur`, `mur+bc`, `random@0.12`, see `parse_gate_label`).
    `settings` are the Context fields shared by every run (a profile's recommendations, then
    the command line's); each run adds its gate, gamma, its label's or budget's overrides, and
    `seed + sample`.
    """

    dataset: str
    strategy: str
    problems: tuple[Problem, ...]
    gates: tuple[str, ...] = ("mur",)
    gammas: tuple[float, ...] = (0.9,)
    budgets: tuple[Budget, ...] = ()
    samples: int = 1
    concurrency: int = 8
    settings: Mapping[str, Any] = field(default_factory=dict)
    out: Path | None = None  # default runs/<dataset>-<strategy>
    command: str = ""  # the command line that asked for it, kept in command.txt

    @property
    def folder(self) -> Path:
        return self.out or Path(f"runs/{self.dataset}-{self.strategy}")

    def folder_settings(self, backbone: BaseChatModel, verifier: BaseChatModel) -> dict[str, Any]:
        """What every run in the folder shares: the models and each Context field but the
        swept gate and gamma (label and budget overrides come on top per run)."""
        shared = Context(**self.settings).model_dump(
            mode="json", exclude={"strategy", "gate", "gamma"}
        )
        return {
            "backbone_model": model_name(backbone),
            "verifier_model": model_name(verifier),
            **shared,
        }

    def context(
        self, gate: str, gamma: float | None, sample: int = 0, overrides: Overrides | None = None
    ) -> Context:
        settings = {
            **self.settings,
            "strategy": self.strategy,
            "gate": gate,
            "gamma": gamma if gamma is not None else self.gammas[0],
            **(overrides or {}),
        }
        settings["seed"] = settings.get("seed", 0) + sample
        return Context(**settings)

    def jobs(self) -> list[Job]:
        """The cross product, with gamma-blind gates run once (their gamma recorded as None)
        and each budget-mode variant as a gate of its own (`mur[budget=B]`, `mur[rate=r]`)."""
        budgets = [budget_label(name, value) for name, value in self.budgets]
        variants = gate_variants([*self.gates, *budgets], self.gammas)
        jobs: list[Job] = []
        for problem in self.problems:
            for label, gate, gamma, overrides in variants:
                for sample in range(self.samples):
                    context = self.context(gate, gamma, sample, overrides)
                    key = JobKey(problem.dataset, problem.id, self.strategy, label, gamma, sample)
                    jobs.append(Job(key, problem, context))
        return jobs


def make_record(
    job: Job,
    result: dict[str, Any],
    correct: bool,
    latency_s: float,
    finished_at: datetime | None = None,
    resumed: bool = False,
) -> dict[str, Any]:
    """One line of records.jsonl. `finished_at` (UTC, now by default) with `latency_s` dates
    the run, so a report can tell how long a table resumed across sessions took; `resumed`
    (recorded only when true) marks a question that went on from its checkpoint."""
    steps = result["steps"]
    finished_at = finished_at or datetime.now(UTC)
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
        "finished_at": finished_at.isoformat(timespec="milliseconds"),
        **({"resumed": True} if resumed else {}),
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
    graph's retries): then the server is gone, and the rest is left for a rerun. A first
    SIGINT/SIGTERM starts no new question and waits for those in flight; a second cancels
    them (evals.stopping). Every request of one job carries the session id
    `<run_id>/<job key>` (servers.sessions), so a router in front of replicas keeps each job
    on one replica. A `graph` compiled with a checkpointer runs each question as the thread
    named by its key: a question stopped part-way resumes there (evals.checkpoints).
    """
    run_id = run_id or uuid.uuid4().hex[:8]
    checkpointed = getattr(graph, "checkpointer", None) is not None
    limit = asyncio.Semaphore(concurrency)
    give_up_after = give_up_after or concurrency + 2
    finished = failed = in_flight = 0
    consecutive_server_failures = 0
    server_gone: str | None = None
    tokens = 0
    # A bar on a terminal; a plain line every few questions in a log (see evals/progress.py),
    # its rate from every request answered so far, questions in flight included.
    run_meter = CallMeter()
    progress = RunProgress(
        len(jobs),
        enabled=show_progress,
        live_tokens=lambda: run_meter.answered.generated_tokens,
    )
    tasks: list[asyncio.Task[None]] = []

    def finish_in_flight(name: str) -> None:
        print(
            f"\n{name}: starting no new questions; the {in_flight} in flight finish and are "
            f"saved. {name} again stops them too (they resume from their last finished step "
            "next time).",
            file=sys.stderr,
            flush=True,
        )

    def cancel_in_flight(name: str) -> None:
        print(
            f"\n{name} again: stopping the {in_flight} questions in flight now",
            file=sys.stderr,
            flush=True,
        )
        for task in tasks:
            task.cancel()

    stop = StopSignals(on_first=finish_in_flight, on_second=cancel_in_flight)

    async def run_one(job: Job) -> None:
        nonlocal finished, tokens, in_flight
        async with limit:
            if server_gone or stop.requested:
                return
            in_flight += 1
            try:
                record = await solve_and_grade(job)
            finally:
                in_flight -= 1
        if record is None:
            return
        finished += 1
        usage = record["usage"]
        tokens += usage["backbone_tokens"] + usage["external_tokens"]
        progress.update(finished=finished, failed=failed, tokens=tokens)

    async def solve_and_grade(job: Job) -> dict[str, Any] | None:
        """The job's record, appended to the store; None when it failed (recorded as such)."""
        nonlocal failed, consecutive_server_failures, server_gone
        begin = time.monotonic()
        question = {"question": job.problem.question, "system_prompt": job.problem.system_prompt}
        try:
            with session(new_session_id(run_id, job.key.text)):
                if checkpointed:
                    solved = await solve_resumable(graph, question, job.context, job.key.text)
                else:
                    result = await graph.ainvoke(question, context=job.context)
                    solved = Solved(result, 0.0, False)
        except Exception as exc:  # recorded with its reason; the run goes on
            if checkpointed and not is_transient(exc):
                await forget(graph, job.key.text)  # its own fault: next time it starts afresh
            failed += 1
            store.append_error(
                {"key": job.key.text, "error": type(exc).__name__, "message": str(exc)[:2000]}
            )
            progress.update(finished=finished, failed=failed, tokens=tokens)
            consecutive_server_failures = (
                consecutive_server_failures + 1 if is_transient(exc) else 0
            )
            if consecutive_server_failures >= give_up_after:
                server_gone = f"{type(exc).__name__}: {str(exc)[:300]}"
            return None
        consecutive_server_failures = 0
        latency = solved.earlier_s + time.monotonic() - begin
        # Grading may take seconds (bounded by math-verify's timeouts): off the event loop.
        correct = await asyncio.to_thread(grade, job.problem, solved.output["answer"])
        record = make_record(job, solved.output, correct, latency, resumed=solved.resumed)
        store.append(record)
        if checkpointed:
            await forget(graph, job.key.text)
        return record

    async with progress:
        with stop, metered(run_meter):  # the tasks inherit the meter
            tasks.extend(asyncio.ensure_future(run_one(job)) for job in jobs)
            try:
                await asyncio.gather(*tasks)
            except asyncio.CancelledError:
                if not stop.forced:
                    raise
                await asyncio.gather(*tasks, return_exceptions=True)  # let each one unwind
    skipped = len(jobs) - finished - failed
    return RunOutcome(finished, failed, skipped, server_gone, stop.requested)


def record_command(path: Path, command: str) -> None:
    """Append the command to the folder's command.txt unless it is already its last line: a
    folder may be filled by several commands (a gamma sweep after the main table), and a
    resumed run repeats its command."""
    lines = path.read_text().splitlines() if path.exists() else []
    if not lines or lines[-1] != command:
        with path.open("a") as fh:
            fh.write(command + "\n")


def run_benchmark(plan: BenchmarkPlan, backbone: BaseChatModel, verifier: BaseChatModel) -> int:
    """Run a plan: skip what its folder already holds, run the rest, report."""
    out = plan.folder
    store = RecordStore(out)
    try:
        store.check_settings(plan.folder_settings(backbone, verifier))
    except SettingsMismatchError as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 2
    record_command(out / "command.txt", plan.command)
    jobs = plan.jobs()
    done = store.done_keys()
    todo = [job for job in jobs if job.key.text not in done]
    print(
        f"{len(plan.problems)} questions x {len(jobs) // max(len(plan.problems), 1)} settings = "
        f"{len(jobs)} runs; {len(jobs) - len(todo)} already in {store.folder}, {len(todo)} to go"
        + (
            f" (dropped {store.dropped_bytes} bytes of a cut-short last line)"
            if store.dropped_bytes
            else ""
        ),
        file=sys.stderr,
    )

    async def run_checkpointed() -> RunOutcome:
        async with open_checkpoints(out) as saver:
            graph = build_graph(backbone=backbone, verifier=verifier, checkpointer=saver)
            return await run_jobs(graph, todo, store, concurrency=plan.concurrency)

    try:
        outcome = asyncio.run(run_checkpointed())
    except KeyboardInterrupt:  # before the run's own signal handling was in place
        print(
            f"\ninterrupted: finished questions are saved in {store.folder}; rerun the same "
            "command to finish the rest",
            file=sys.stderr,
        )
        return STOPPED_EXIT
    if outcome.stopped_by:
        print(
            f"stopped ({outcome.stopped_by}): {outcome.finished} runs finished this time and "
            f"are saved in {store.folder}, {outcome.skipped} left; rerun the same command to "
            "finish the rest",
            file=sys.stderr,
        )
        return STOPPED_EXIT
    if outcome.server_gone:
        print(
            f"the model server stopped answering ({outcome.server_gone}); "
            f"{outcome.finished} runs finished and are saved in {store.folder}. Start the server "
            "again and rerun the same command to finish the rest.",
            file=sys.stderr,
        )
        return 1
    report = write_report(out)
    print(report.markdown)
    print(f"records: {store.folder}\nreport: {report.markdown_path}", file=sys.stderr)
    if outcome.failed:
        print(
            f"{outcome.failed} runs failed (reasons in {store.errors_path}); rerun the same "
            "command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0
