"""One worker process of `mur solve --dataset ... --workers N`: it runs the questions its parent
hands it, one by one, and tells the parent how each ended (the parent's side: harness/pool.py).

The two talk in JSON lines over the worker's own pipes, one pair per worker, so a worker that
dies mid-line can garble nothing another worker says. The parent writes to the worker's stdin:

    {"do": "start", "run_id": "...", "concurrency": C}   first: the run's id, the worker's share
    {"do": "run", "key": "..."}    a question (a run's record key) to start now
    {"do": "end"}                  no more will come: finish those in flight, then exit
    {"do": "cancel"}               stop those in flight now (they resume next time), then exit
    (end of file)                  the parent is gone: as cancel, so no orphan records anything
                                   a rerun of the command is about to run again

and the worker answers on what was its stdout (print() goes to stderr from the start, so a
stray line cannot break the protocol):

    {"event": "ready"}                             connected, checkpoints open: hand me runs
    {"event": "done", "key": K, "tokens": T, "here": H}   recorded; T its tokens, H made here
    {"event": "failed", "key": K, "why": "...", "server": true}   recorded in errors.jsonl;
                                                   server: the server's fault (runner.py)
    {"event": "gone", "reason": "..."}             the server was stopped on purpose
    {"event": "tokens", "made": N}                 every TICK_S: tokens made so far, in flight
                                                   included (the parent's one progress line)

A run is recorded (records.jsonl, under the folder's lock) before its event is sent, so a
worker killed between the two leaves a record the rerun skips, never a run done twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel

from mur.evals.harness.checkpoints import open_checkpoints
from mur.evals.harness.plan import EvaluationPlan, Job
from mur.evals.harness.records import RecordStore
from mur.evals.harness.run_record import total_tokens
from mur.evals.harness.runner import REASON_CHARS, Failure, Runner
from mur.graphs.model_calls import server_roles
from mur.graphs.mur import build_graph
from mur.nodes.usage import metered

TICK_S = 1.0  # seconds between two token counts sent to the parent
NEVER = sys.maxsize  # the worker's own rule never gives up: the parent counts failures in a row
# across workers; `mur servers down` (ServerStopped) is the one failure a worker reports at once


class Channel:
    """The worker's end of its pipes: requests from stdin, events to the descriptor that was
    stdout when the worker started."""

    def __init__(self, events_fd: int) -> None:
        self.events_fd = events_fd
        self.parent_gone = False

    @classmethod
    def take_stdout(cls) -> Channel:
        """Keep stdout's pipe for events and send everything printed to stderr instead."""
        sys.stdout.flush()
        events_fd = os.dup(sys.stdout.fileno())
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        return cls(events_fd)

    def send(self, event: str, **fields: Any) -> None:
        """One line, one write: under PIPE_BUF bytes, so it arrives whole or not at all."""
        line = (json.dumps({"event": event, **fields}) + "\n").encode()
        try:
            os.write(self.events_fd, line)
        except BrokenPipeError:  # the parent died: Serving stops what runs (`_tell`)
            self.parent_gone = True

    async def requests(self) -> asyncio.StreamReader:
        """stdin, read without blocking the event loop."""
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        return reader


async def read_request(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The parent's next request; None at the end of stdin (a line cut short counts as that:
    the parent died writing it)."""
    line = await reader.readline()
    if not line.endswith(b"\n"):
        return None
    request: dict[str, Any] = json.loads(line)
    return request


def serve(
    plan: EvaluationPlan, backbone: BaseChatModel, verifier: BaseChatModel, channel: Channel
) -> None:
    """Run the plan's jobs the parent names, until it says end or cancel, or goes away."""
    asyncio.run(_serve(plan, backbone, verifier, channel))


async def _serve(
    plan: EvaluationPlan, backbone: BaseChatModel, verifier: BaseChatModel, channel: Channel
) -> None:
    requests = await channel.requests()
    start = await read_request(requests)
    if start is None:  # the parent died before it said anything
        return
    if start.get("do") != "start":
        raise ValueError(f"the parent's first request is not start: {start}")
    share = int(start["concurrency"])
    jobs = {job.key.text: job for job in plan.jobs()}
    async with open_checkpoints(plan.folder) as saver:
        graph = build_graph(backbone=backbone, verifier=verifier, checkpointer=saver)
        runner = Runner(
            graph,
            (),
            RecordStore(plan.folder),
            concurrency=share,
            give_up_after=NEVER,
            run_id=str(start["run_id"]),
            show_progress=False,
            roles=server_roles(backbone, verifier),
        )
        channel.send("ready")
        await Serving(runner, jobs, channel).serve(requests)


class Serving:
    """The questions of one worker in flight: each a task, started when the parent says."""

    def __init__(self, runner: Runner, jobs: Mapping[str, Job], channel: Channel) -> None:
        self.runner, self.jobs, self.channel = runner, jobs, channel
        self.running: set[asyncio.Task[None]] = set()
        self.ended = asyncio.Event()  # no more requests to act on
        self.said_gone = False
        self.crashed: BaseException | None = None

    async def serve(self, requests: asyncio.StreamReader) -> None:
        """Until the parent says end (and those in flight are done), cancel, or goes away."""
        with metered(self.runner.meter):  # the tasks started below inherit the meter
            listening = asyncio.create_task(self._listen(requests))
            ticking = asyncio.create_task(self._tick())
            await self.ended.wait()
            while self.running:
                await asyncio.wait(set(self.running))
            ticking.cancel()
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # the cancels just above
                await ticking
            with contextlib.suppress(asyncio.CancelledError):
                await listening  # an error it met is raised here
        self._count_tokens(-1)
        if self.crashed is not None:
            raise self.crashed

    async def _listen(self, requests: asyncio.StreamReader) -> None:
        try:
            while (request := await read_request(requests)) is not None:
                if request["do"] == "run":
                    self._start(request["key"])
                elif request["do"] == "end":
                    self.ended.set()
                elif request["do"] == "cancel":
                    break
                else:
                    raise ValueError(f"unknown request from the parent: {request}")
        finally:  # cancel, the parent gone, an error; or, after end, nothing is left to cancel
            self._stop()

    def _start(self, key: str) -> None:
        if key not in self.jobs:
            raise ValueError(f"the parent handed a run this worker's plan does not have: {key}")
        task = asyncio.create_task(self._run(self.jobs[key]))
        self.running.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """A task that raised (not a question's failure, which the runner records: a broken
        records file, say) ends the worker, its error raised by `serve`."""
        self.running.discard(task)
        if not task.cancelled() and task.exception() is not None and self.crashed is None:
            self.crashed = task.exception()
            self._stop()

    def _stop(self) -> None:
        """Cancel the questions in flight and end `serve`."""
        for task in self.running:
            task.cancel()
        self.ended.set()

    async def _run(self, job: Job) -> None:
        record, here = await self.runner.run_one(job)
        if isinstance(record, Failure):
            self._tell("failed", key=job.key.text, why=record.why, server=record.server)
        else:
            self._tell("done", key=job.key.text, tokens=total_tokens(record), here=here)
        if self.runner.server_gone and not self.said_gone:
            self.said_gone = True
            self._tell("gone", reason=self.runner.server_gone[:REASON_CHARS])

    def _tell(self, event: str, **fields: Any) -> None:
        """An event for the parent; if it is gone, what runs here stops now (as at the end
        of stdin, which follows): no orphan records what a rerun is about to run again."""
        self.channel.send(event, **fields)
        if self.channel.parent_gone:
            self._stop()

    async def _tick(self) -> None:
        sent = 0
        while True:
            await asyncio.sleep(TICK_S)
            sent = self._count_tokens(sent)

    def _count_tokens(self, sent: int) -> int:
        """Send the tokens made so far unless `sent` said them already; returns the count."""
        made = self.runner.meter.answered.generated_tokens
        if made != sent:
            self._tell("tokens", made=made)
        return made
