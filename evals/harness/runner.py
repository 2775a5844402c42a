"""The benchmark runner: jobs run concurrently, each finished question appended to
records.jsonl at once (a rerun finishes the rest), a failing server or a stop signal ending
the run without losing what is done."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evals.harness.checkpoints import Solved, forget, solve_resumable
from evals.harness.plan import Job
from evals.harness.progress import RunProgress
from evals.harness.records import RecordStore
from evals.harness.run_record import RunRecord, make_record, setting_of, total_tokens
from evals.harness.stopping import StopSignals
from evals.questions import grade
from nodes.usage import CallMeter, metered
from servers.sessions import new_session_id, session
from servers.transport_errors import is_transient


@dataclass(frozen=True)
class RunOutcome:
    finished: int
    failed: int
    skipped: int
    server_gone: str | None  # why the run gave up early, if it did
    stopped_by: str | None = None  # the signal (SIGINT, SIGTERM) that stopped it early


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
    them (evals.harness.stopping). Every request of one job carries the session id
    `<run_id>/<job key>` (servers.sessions), so a router in front of replicas keeps each job
    on one replica. A `graph` compiled with a checkpointer runs each question as the thread
    named by its key: a question stopped part-way resumes there (evals.harness.checkpoints).
    """
    run_id = run_id or uuid.uuid4().hex[:8]
    checkpointed = getattr(graph, "checkpointer", None) is not None
    limit = asyncio.Semaphore(concurrency)
    give_up_after = give_up_after or concurrency + 2
    finished = failed = in_flight = 0
    consecutive_server_failures = 0
    server_gone: str | None = None
    # A bar on a terminal; a plain line every few questions in a log (evals/harness/progress.py),
    # its rate from every request answered so far, questions in flight included.
    run_meter = CallMeter()
    progress = RunProgress(
        len(jobs),
        enabled=show_progress,
        live_tokens=lambda: run_meter.answered.generated_tokens,
        settings=[job.key.setting for job in jobs],
        recorded=[
            (setting_of(r["strategy"], r["gate"], r["gamma"]), total_tokens(r))
            for r in store.load()
        ],
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
        nonlocal finished, in_flight
        async with limit:
            if server_gone or stop.requested:
                return
            in_flight += 1
            try:
                with metered() as made_here:  # a resumed question's record counts more
                    record = await solve_and_grade(job)
            finally:
                in_flight -= 1
        if record is None:
            return
        finished += 1
        progress.finished_one(
            total_tokens(record), job.key.setting, here=made_here.answered.generated_tokens
        )

    async def solve_and_grade(job: Job) -> RunRecord | None:
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
            progress.failed_one(job.key.setting)
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
        record = make_record(
            job.key, job.problem.answer, solved.output, correct, latency, resumed=solved.resumed
        )
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
