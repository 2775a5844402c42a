"""The evaluation runner: jobs run concurrently, each finished question appended to
records.jsonl at once (a rerun finishes the rest), a failing server or a stop signal ending
the run without losing what is done."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mur.evals.harness.checkpoints import Solved, forget, solve_resumable
from mur.evals.harness.plan import Job
from mur.evals.harness.progress import RunProgress
from mur.evals.harness.records import RecordStore
from mur.evals.harness.run_record import RunRecord, make_record, setting_of, total_tokens
from mur.evals.harness.shutdown import StopSignals, cancelling_line, finishing_line
from mur.evals.questions import grade
from mur.graphs.model_calls import describe_failure
from mur.nodes.usage import CallMeter, metered
from mur.servers.clients.collector import tune_collector
from mur.servers.clients.errors import ServerStopped
from mur.servers.clients.sessions import new_session_id, session
from mur.servers.clients.transport_errors import is_transient

REASON_CHARS = 1000
"""A failure's reason at most: one line (a worker sends it to its parent in one atomic pipe
write, evals.harness.worker)."""


@dataclass(frozen=True)
class Failure:
    """Why a question failed (the line `mur solve` prints for it: a server named by its role
    and URL, what it did or sent back, after how many attempts), and whether the server was at
    fault (what counts towards giving up on it)."""

    why: str
    server: bool


@dataclass
class GiveUpRule:
    """When a run gives up on its server: `after` questions in a row failed on it, or it was
    stopped on purpose (ServerStopped). The one rule of a run in one process (Runner) and in
    workers (harness/pool.py's parent, counting theirs in the order they end)."""

    after: int
    failures_in_a_row: int = 0
    gone: str | None = None  # why it gave up: the first reason stands

    @classmethod
    def for_concurrency(cls, concurrency: int, after: int | None = None) -> GiveUpRule:
        """By default more than the questions in flight, which one bad moment fails at once."""
        return cls(after or concurrency + 2)

    def succeeded(self) -> None:
        self.failures_in_a_row = 0

    def failed(self, why: str, server: bool) -> None:
        """`server`: the server's fault; a question's own shows the server answers."""
        self.failures_in_a_row = self.failures_in_a_row + 1 if server else 0
        if self.failures_in_a_row >= self.after:
            self.give_up(why)

    def give_up(self, why: str) -> None:
        """No more questions start."""
        self.gone = self.gone or why


@dataclass(frozen=True)
class RunOutcome:
    finished: int
    failed: int
    skipped: int
    server_gone: str | None  # why the run gave up early, if it did
    stopped_by: str | None = None  # the signal (SIGINT, SIGTERM) that stopped it early
    lost: str | None = None  # worker processes that died, and what they left (--workers)


def run_progress(
    jobs: Sequence[Job], store: RecordStore, enabled: bool, live_tokens: Callable[[], int]
) -> RunProgress:
    """A run's progress, its questions priced by the folder's records (one process or workers)."""
    return RunProgress(
        len(jobs),
        enabled=enabled,
        live_tokens=live_tokens,
        settings=[job.key.setting for job in jobs],
        recorded=[
            (setting_of(r["strategy"], r["gate"], r["gamma"]), total_tokens(r))
            for r in store.load()
        ],
    )


async def run_jobs(
    graph: Any,
    jobs: Sequence[Job],
    store: RecordStore,
    *,
    concurrency: int,
    show_progress: bool = True,
    give_up_after: int | None = None,
    run_id: str | None = None,
    roles: Mapping[str, str] | None = None,
) -> RunOutcome:
    """Run the jobs (at most `concurrency` in flight), appending each record as it finishes.

    A question that fails is recorded in errors.jsonl and the run goes on, unless
    `give_up_after` questions in a row fail on the server itself (unreachable, 5xx after the
    graph's retries): then the server is gone, and the rest is left for a rerun. A first
    SIGINT/SIGTERM starts no new question and waits for those in flight; a second cancels
    them (evals.harness.shutdown). Every request of one job carries the session id
    `<run_id>/<job key>` (servers.clients.sessions), so a router in front of replicas keeps each job
    on one replica. A `graph` compiled with a checkpointer runs each question as the thread
    named by its key: a question stopped part-way resumes there (evals.harness.checkpoints).
    `roles` (base URL -> "backbone" / "verifier", graphs.model_calls.server_roles) names the
    servers in a failed question's reason.
    """
    return await Runner(
        graph,
        jobs,
        store,
        concurrency=concurrency,
        give_up_after=give_up_after,
        run_id=run_id or uuid.uuid4().hex[:8],
        show_progress=show_progress,
        roles=roles,
    ).run()


class Runner:
    """One evaluation run: its counters are fields, each job a task (`run`)."""

    def __init__(
        self,
        graph: Any,
        jobs: Sequence[Job],
        store: RecordStore,
        *,
        concurrency: int,
        give_up_after: int | None,
        run_id: str,
        show_progress: bool,
        roles: Mapping[str, str] | None = None,
    ) -> None:
        self.graph, self.jobs, self.store, self.run_id = graph, jobs, store, run_id
        self.roles = dict(roles or {})
        self.checkpointed = getattr(graph, "checkpointer", None) is not None
        self.limit = asyncio.Semaphore(concurrency)
        self.give_up_rule = GiveUpRule.for_concurrency(concurrency, give_up_after)
        self.finished = self.failed = self.in_flight = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.stop = StopSignals(on_first=self._finish_in_flight, on_second=self._cancel_in_flight)
        # Every request answered so far, questions in flight included: the progress line's rate.
        self.meter = CallMeter()
        self.progress = run_progress(
            jobs, store, show_progress, lambda: self.meter.answered.generated_tokens
        )
        tune_collector()  # start-up is done: what it left stays, off the collector's path

    @property
    def server_gone(self) -> str | None:
        """Why the run gave up on its server, if it did."""
        return self.give_up_rule.gone

    async def run(self) -> RunOutcome:
        jobs = self.jobs
        async with self.progress:
            with self.stop, metered(self.meter):  # the tasks inherit the meter
                self.tasks.extend(asyncio.ensure_future(self._run_one(job)) for job in jobs)
                try:
                    await asyncio.gather(*self.tasks)
                except asyncio.CancelledError:
                    if not self.stop.forced:
                        raise
                    await asyncio.gather(*self.tasks, return_exceptions=True)  # each unwinds
        skipped = len(jobs) - self.finished - self.failed
        return RunOutcome(
            self.finished, self.failed, skipped, self.server_gone, self.stop.requested
        )

    def _finish_in_flight(self, name: str) -> None:
        print(finishing_line(name, self.in_flight), file=sys.stderr, flush=True)

    def _cancel_in_flight(self, name: str) -> None:
        print(cancelling_line(name, self.in_flight), file=sys.stderr, flush=True)
        for task in self.tasks:
            task.cancel()

    async def _run_one(self, job: Job) -> None:
        async with self.limit:
            if self.server_gone or self.stop.requested:
                return
            record, made_here = await self.run_one(job)
        if isinstance(record, Failure):
            return
        self.finished += 1
        self.progress.finished_one(total_tokens(record), job.key.setting, here=made_here)

    async def run_one(self, job: Job) -> tuple[RunRecord | Failure, int]:
        """Solve, grade and record one job now (a worker process's runner is handed its jobs
        one by one: evals.harness.worker): its record, or why it failed (recorded as such),
        and the tokens made for it in this run (a resumed question's record counts more)."""
        self.in_flight += 1
        try:
            with metered() as made_here:
                record = await self._solve_and_grade(job)
        finally:
            self.in_flight -= 1
        return record, made_here.answered.generated_tokens

    async def _solve_and_grade(self, job: Job) -> RunRecord | Failure:
        """The job's record, appended to the store; why it failed (recorded as such)."""
        begin = time.monotonic()
        question = {"question": job.problem.question, "system_prompt": job.problem.system_prompt}
        try:
            with session(new_session_id(self.run_id, job.key.text)):
                solved = await self._solve(job, question)
        except Exception as exc:  # recorded with its reason; the run goes on
            return await self._failed(job, exc)
        self.give_up_rule.succeeded()
        latency = solved.earlier_s + time.monotonic() - begin
        # Grading may take seconds (bounded by math-verify's timeouts): off the event loop.
        correct = await asyncio.to_thread(grade, job.problem, solved.output["answer"])
        record = make_record(
            job.key, job.problem.answer, solved.output, correct, latency, resumed=solved.resumed
        )
        self.store.append(record)
        if self.checkpointed:
            await forget(self.graph, job.key.text)
        return record

    async def _solve(self, job: Job, question: dict[str, Any]) -> Solved:
        if self.checkpointed:
            return await solve_resumable(self.graph, question, job.context, job.key.text)
        return Solved(await self.graph.ainvoke(question, context=job.context), 0.0, False)

    async def _failed(self, job: Job, exc: Exception) -> Failure:
        """Record a failed question, say why it failed, and count it (GiveUpRule)."""
        transient = is_transient(exc)
        stopped = isinstance(exc, ServerStopped)  # on purpose: the question resumes later
        if self.checkpointed and not transient and not stopped:
            await forget(self.graph, job.key.text)  # its own fault: next time it starts afresh
        self.failed += 1
        why = describe_failure(exc, self.roles)[:REASON_CHARS]
        self.store.append_error({"key": job.key.text, "error": type(exc).__name__, "message": why})
        self.progress.failed_one(job.key.setting)
        if stopped:
            self.give_up_rule.give_up(str(exc))
        self.give_up_rule.failed(why, server=transient)
        return Failure(why, transient)
