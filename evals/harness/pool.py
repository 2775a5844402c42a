"""`mur solve --dataset ... --workers N`: one run folder's questions in N worker processes.

Against a fast GPU server the client becomes the bottleneck: one process runs every question's
graph on one core (the GIL). Here the parent hands the questions out and N workers run them
(harness/worker.py), each with its own clients, event loop and share of `--concurrency`. It
is the same run as one process makes, records, checkpoints and all:

- Hand-out: dynamic. Each worker holds up to its share of questions in flight (the
  concurrency split as evenly as it goes; never more workers than questions in flight or to
  go), so the server's load stays what the throughput probe measured for the whole run.
- Records: each worker appends under the folder's lock (records.py); the parent hands each
  question to one worker once, and writes the report alone once every worker has ended.
- Checkpoints: every worker opens the folder's one checkpoints.sqlite (WAL, a long busy
  timeout), which the parent makes first so workers never race to create it. A question's
  thread is its record key, so it resumes on whichever worker runs it next time.
- Signals: only the parent acts on SIGINT/SIGTERM (harness/shutdown.py). A first stop tells
  every worker `end`, a second `cancel`; exit status and lines are those of one process.
- A worker that dies is noticed when its pipe closes. Its questions in flight are left for a
  rerun, not handed on: it may have recorded one just before it died, and a question that
  killed one worker would likely kill the next. At the end the parent exits 1 naming it.
- The server gone: the parent counts server failures in a row in the order workers report
  them, with the one GiveUpRule of harness/runner.py.
- Progress: the parent shows the one bar or line; each worker sends its tokens every second,
  so the rate and ETA count questions in flight as one process's do.

Each worker is `mur solve` itself with a hidden `--worker` flag (cli/), not a multiprocessing
child: the same arguments make the same plan and connection, nothing is pickled, and no state
of the parent (HTTP clients, event loop, threads) is shared. Its pipes are its own, so a killed
worker corrupts no queue the others read (multiprocessing's Queue holds a lock a killed process
may never release).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from mur.evals.harness.checkpoints import open_checkpoints
from mur.evals.harness.plan import Job
from mur.evals.harness.records import RecordStore
from mur.evals.harness.runner import GiveUpRule, RunOutcome, run_progress
from mur.evals.harness.shutdown import (
    StopSignals,
    blocked_stop_signals,
    cancelling_line,
    finishing_line,
)

REAP_S = 30.0  # seconds a worker has to go once the parent's error closed its stdin


@dataclass(frozen=True)
class WorkerPool:
    """How to run an evaluation's questions in several processes: how many, and the command
    that starts one (harness/worker.py's side of the pipes)."""

    count: int
    command: tuple[str, ...]


def shares(concurrency: int, workers: int) -> list[int]:
    """Questions in flight per worker: `concurrency` split as evenly as it goes, the first
    ones taking one more."""
    return [concurrency // workers + (i < concurrency % workers) for i in range(workers)]


@dataclass
class Worker:
    """The parent's view of one worker process."""

    number: int  # from 1, as the lines name it
    share: int
    process: asyncio.subprocess.Process
    in_flight: set[str] = field(default_factory=set)
    ready: bool = False
    ended: bool = False  # told `end`
    cancelled: bool = False  # told `cancel`
    exited: bool = False  # its pipe closed
    tokens: int = 0  # made so far, questions in flight included
    garbled: bytes = b""  # a line it wrote that is not an event (then it was killed)


async def run_in_workers(
    jobs: Sequence[Job],
    store: RecordStore,
    *,
    concurrency: int,
    pool: WorkerPool,
    show_progress: bool = True,
) -> RunOutcome:
    """Run the jobs in `pool.count` worker processes (fewer when there are fewer questions in
    flight or to go), `concurrency` questions in flight in all; the outcome as `run_jobs`
    gives it, and `lost` naming the workers that died."""
    if not jobs:
        return RunOutcome(0, 0, 0, None)
    count = min(pool.count, concurrency, len(jobs))
    split = shares(concurrency, count)
    fewer = f" ({pool.count} asked; no more than questions in flight or to go)"
    print(
        f"{count} worker processes, {' + '.join(map(str, split))} questions in flight"
        + (fewer if count < pool.count else ""),
        file=sys.stderr,
    )
    async with open_checkpoints(store.folder):  # made and in WAL mode before workers open it
        pass
    return await Parent(jobs, store, split, pool.command, show_progress).run()


class Parent:
    """One run in workers: the questions to go, the workers, the counts."""

    def __init__(
        self,
        jobs: Sequence[Job],
        store: RecordStore,
        split: list[int],
        command: tuple[str, ...],
        show_progress: bool,
    ) -> None:
        self.total, self.split, self.command = len(jobs), split, command
        self.queue = deque(job.key.text for job in jobs)
        self.settings = {job.key.text: job.key.setting for job in jobs}
        self.run_id = uuid.uuid4().hex[:8]
        self.workers: list[Worker] = []
        self.finished = self.failed = 0
        self.give_up_rule = GiveUpRule.for_concurrency(sum(split))  # as one process
        self.lost: list[str] = []
        self.stop = StopSignals(
            on_first=partial(self._stop, finishing_line),
            on_second=partial(self._stop, cancelling_line),
        )
        self.progress = run_progress(
            jobs, store, show_progress, lambda: sum(worker.tokens for worker in self.workers)
        )

    @property
    def in_flight(self) -> int:
        return sum(len(worker.in_flight) for worker in self.workers)

    async def run(self) -> RunOutcome:
        async with self.progress:
            with self.stop:
                try:
                    for number, share in enumerate(self.split, start=1):
                        self.workers.append(await self._start(number, share))
                    await asyncio.gather(*(self._follow(worker) for worker in self.workers))
                finally:
                    await self._reap()
        left = self.total - self.finished - self.failed
        return RunOutcome(
            self.finished,
            self.failed,
            left,
            self.give_up_rule.gone,
            self.stop.requested,
            "; ".join(self.lost) or None,
        )

    async def _start(self, number: int, share: int) -> Worker:
        # Blocked while it starts, so a Ctrl-C now reaches the worker only once it ignores it.
        with blocked_stop_signals():
            process = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
        worker = Worker(number, share, process)
        self._send(worker, do="start", run_id=self.run_id, concurrency=share)
        self._settle(worker)  # a stop that came meanwhile
        return worker

    async def _follow(self, worker: Worker) -> None:
        """Read the worker's events until its pipe closes, then see how it ended."""
        assert worker.process.stdout is not None  # started with stdout=PIPE
        async for line in worker.process.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                worker.garbled = line[:200]  # not the protocol: a broken worker, stopped
                worker.process.kill()
                break
            self._on_event(worker, event)
            # The server gone, no more questions start anywhere.
            for each in self.workers if self.give_up_rule.gone is not None else [worker]:
                self._settle(each)
        worker.exited = True
        status = await worker.process.wait()
        assert worker.process.stdin is not None
        worker.process.stdin.close()
        if status != 0 or (worker.in_flight and not worker.cancelled):
            self.lost.append(self._death(worker, status))

    def _on_event(self, worker: Worker, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "ready":
            worker.ready = True
        elif kind == "done":
            worker.in_flight.discard(event["key"])
            self.finished += 1
            self.give_up_rule.succeeded()
            self.progress.finished_one(
                event["tokens"], self.settings[event["key"]], here=event["here"]
            )
        elif kind == "failed":
            worker.in_flight.discard(event["key"])
            self.failed += 1
            self.progress.failed_one(self.settings[event["key"]])
            self.give_up_rule.failed(str(event["why"]), server=bool(event["server"]))
        elif kind == "gone":
            self.give_up_rule.give_up(str(event["reason"]))
        elif kind == "tokens":
            worker.tokens = int(event["made"])

    def _settle(self, worker: Worker) -> None:
        """Tell the worker what it should do now: cancel (a second stop signal); take
        questions up to its share; or end, once no more will come (a stop, the server gone,
        none left)."""
        if worker.exited or worker.cancelled:
            return
        if self.stop.forced:
            worker.cancelled = True
            self._send(worker, do="cancel")
            return
        if worker.ended:
            return
        closed = self.stop.requested is not None or self.give_up_rule.gone is not None
        while worker.ready and not closed and self.queue and len(worker.in_flight) < worker.share:
            key = self.queue.popleft()
            worker.in_flight.add(key)
            self._send(worker, do="run", key=key)
        if closed or not self.queue:
            worker.ended = True
            self._send(worker, do="end")

    def _send(self, worker: Worker, **request: Any) -> None:
        """One request down the worker's stdin (no wait: a few bytes; a dead worker's pipe
        drops them, and its closed stdout tells `_follow`)."""
        assert worker.process.stdin is not None  # started with stdin=PIPE
        worker.process.stdin.write((json.dumps(request) + "\n").encode())

    def _stop(self, line: Callable[[str, int], str], name: str) -> None:
        """A stop signal: say `line`, then tell every worker (`_settle`)."""
        print(line(name, self.in_flight), file=sys.stderr, flush=True)
        for worker in self.workers:
            self._settle(worker)

    def _death(self, worker: Worker, status: int) -> str:
        """One worker's end, in a few words: who, how, and what it left."""
        if status < 0:
            try:
                how = f"was killed by {signal.Signals(-status).name}"
            except ValueError:  # a signal number Python has no name for
                how = f"was killed by signal {-status}"
        else:
            how = f"exited with status {status}"
        if worker.garbled:
            how = f"wrote {worker.garbled!r}, not an event, and was stopped"
        left = len(worker.in_flight)
        return (
            f"worker {worker.number} of {len(self.split)} (pid {worker.process.pid}) {how} "
            + (f"with {left} runs in flight, left for a rerun" if left else "")
        ).strip()

    async def _reap(self) -> None:
        """Workers still running when the run ends: only after an error in the parent, which
        must not leave them behind. Their stdin closes, so they cancel what they run (it
        resumes next time) and go; one that does not within REAP_S is killed."""
        running = [worker for worker in self.workers if worker.process.returncode is None]
        for worker in running:
            assert worker.process.stdin is not None
            worker.process.stdin.close()
        for worker in running:
            try:
                await asyncio.wait_for(worker.process.wait(), REAP_S)
            except TimeoutError:
                worker.process.kill()
                await worker.process.wait()
