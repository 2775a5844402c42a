"""Graph runs: the compiled graph over the checkpointer, the one place a request's run starts
(`RunService.start`), the limit on runs in flight, and how a run is given up when its client
goes away.

A run with an idempotency key is a checkpointed thread (its state saved after each node, in
the checkpointer the endpoint opened at start) claimed in the run ledger first
(endpoint/durable.py): a retry with the same key gets the finished reply, or resumes the thread
after its last finished node, on whichever replica it reaches. A run without a key runs on the
same graph compiled without a checkpointer, claimed nowhere: nothing could ever resume it, so
it writes nothing (a retry, or the router's, starts it afresh).

A run is an asyncio task of its own, not an async generator resumed from the response: that
keeps LangGraph's context variables in one task, and lets a disconnect cancel it. Cancelling
the task cancels the model call in flight (its HTTP request is closed, and vLLM aborts a
request whose client has gone), so a run stops within the step it was in; its checkpoints stay,
and its claim is freed for a retry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel

from mur.endpoint.durable import (
    DurableRuns,
    StoredReply,
    Ticket,
    check_periods,
)
from mur.endpoint.errors import APIError
from mur.endpoint.refusals import DRAINING, NOT_OPEN, Saturated, lease_lost, unavailable
from mur.endpoint.replies import Outcome, RunResult
from mur.endpoint.schemas import Job
from mur.graphs import build_graph
from mur.graphs.model_calls import describe_failure, server_roles
from mur.graphs.solve import SavedProgress, saved_progress, solve
from mur.integrations.chat import trace_of
from mur.nodes.usage import USAGE_KEYS
from mur.persistence.checkpointers import CheckpointStore
from mur.persistence.fence import FencedSaver
from mur.persistence.ledger import ClaimLost, RunLedger
from mur.servers.clients.chat_models import base_url_of
from mur.servers.clients.sessions import new_session_id, session

log = logging.getLogger("mur.endpoint")
T = TypeVar("T")
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_KEEP_FINISHED = 3600.0

END = None
"""Put in a run's step queue after its last step (or when it fails or is cancelled)."""


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class Run:
    """A started run: its ticket, its task (returning the result, or raising) and its kept
    steps."""

    job: Job
    ticket: Ticket
    task: asyncio.Task[RunResult]
    steps: asyncio.Queue[dict[str, Any] | None]


class ClientGone(Exception):
    """The client disconnected before the run ended; its run was cancelled."""


def usage_since(total: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """The usage a run added to `before` to reach `total`."""
    return {key: int(total.get(key, 0)) - int(before.get(key, 0)) for key in USAGE_KEYS}


class RunService:
    """The compiled graph over the checkpointer, and the runs over it."""

    def __init__(
        self,
        backbone: BaseChatModel,
        verifier: BaseChatModel | None = None,
        *,
        max_runs: int = 64,
        retry_after: int = 1,
        replica_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        keep_finished: float = DEFAULT_KEEP_FINISHED,
    ) -> None:
        if max_runs < 1 or retry_after < 1:
            raise ValueError(
                f"max_runs and retry_after must be >= 1, got {max_runs} and {retry_after}"
            )
        check_periods(lease_seconds, keep_finished)  # here, not once the app is serving
        self.backbone = backbone
        self.verifier = verifier or backbone
        self.max_runs, self.retry_after = max_runs, retry_after
        self.replica_id = replica_id or default_replica_id()
        self.lease_seconds, self.keep_finished = lease_seconds, keep_finished
        self.in_flight = 0
        self.accepting = True
        self.runs: set[asyncio.Task[RunResult]] = set()
        self.store: CheckpointStore | None = None
        self._durable: DurableRuns | None = None
        self._graph: Any = None
        self._keyless_graph: Any = None
        self.roles = server_roles(self.backbone, self.verifier)  # for error messages

    async def open(self, store: CheckpointStore) -> None:
        """Compile the graph over `store`'s saver, each run's checkpoints fenced by its claim,
        and once without a checkpointer for keyless runs; start renewing leases and pruning."""
        self.store = store
        ledger = RunLedger(store.database)
        await ledger.upgrade()
        self._graph = build_graph(
            backbone=self.backbone,
            verifier=self.verifier,
            checkpointer=FencedSaver(store.saver, ledger),
        )
        self._keyless_graph = build_graph(backbone=self.backbone, verifier=self.verifier)
        self._durable = DurableRuns(
            ledger,
            store.saver,
            replica_id=self.replica_id,
            lease_seconds=self.lease_seconds,
            keep_finished=self.keep_finished,
        )
        self._durable.start()

    def stop_taking_runs(self) -> None:
        """From now on a new run (or a replay) is refused with 503 and Retry-After (drain)."""
        self.accepting = False

    async def cancel_runs(self) -> int:
        """Cancel every run in flight and wait until each has stopped: its checkpoints stay
        and its claim is freed, so a retry with its key resumes it at once on another replica.
        How many were cancelled."""
        tasks = list(self.runs)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    async def close(self) -> None:
        """Cancel the runs in flight and stop renewing and pruning; the store is closed by
        whoever opened it."""
        await self.cancel_runs()
        if self._durable is not None:
            await self._durable.close()
        self._durable, self._graph, self._keyless_graph = None, None, None

    @property
    def durable(self) -> DurableRuns:
        if self._durable is None:
            raise NOT_OPEN
        return self._durable

    def graph(self, ticket: Ticket | None = None) -> Any:
        """The compiled graph, every strategy in it: checkpointed in the store, or without a
        checkpointer for a keyless ticket's run (one without a claim)."""
        if self._graph is None:
            raise NOT_OPEN
        if ticket is not None and ticket.claim is None:
            return self._keyless_graph
        return self._graph

    async def admit(
        self, job: Job, caller: str, key: str | None, fingerprint: str
    ) -> Ticket | StoredReply:
        """The run of this request, claimed; or its stored reply. 429 when every slot is
        taken (a replay needs none), 409/422/503 as `DurableRuns.claim` says."""
        durable = self.durable
        if not self.accepting:
            raise DRAINING
        if key is None and self.in_flight >= self.max_runs:
            raise Saturated(self.max_runs, self.retry_after)
        admitted = await durable.claim(caller, key, fingerprint)
        if isinstance(admitted, Ticket) and self.in_flight >= self.max_runs:
            await durable.stopped(admitted, "not started: every run slot was taken")
            raise Saturated(self.max_runs, self.retry_after)
        return admitted

    def start(self, job: Job, ticket: Ticket) -> Run:
        """Start the graph run of `job` as `ticket`'s thread, in a task of its own.

        The slot is held until the task ends (finished, failed or cancelled).
        """
        steps: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        task = asyncio.create_task(self._execute(job, ticket, steps), name=job.model)
        self.durable.watch(ticket, task)
        self.in_flight += 1
        self.runs.add(task)
        task.add_done_callback(self._ended)
        return Run(job, ticket, task, steps)

    async def _execute(
        self, job: Job, ticket: Ticket, steps: asyncio.Queue[dict[str, Any] | None]
    ) -> RunResult:
        """Run (or resume) the thread; record its reply, or free its claim when it stops. A
        keyless run (no claim, no config) runs on the graph without a checkpointer."""
        graph, durable = self.graph(ticket), self.durable
        config = ticket.config()  # its checkpoints are fenced by its claim; None: keyless
        try:
            # One session per run: a router keeps its model calls on one replica.
            with session(new_session_id("mur-endpoint", ticket.thread_id[-12:])):
                saved = SavedProgress(new=True)
                if config is not None:
                    saved = await saved_progress(graph, config)
                if job.context.traces == 1:  # the steps kept before, so the stream is whole
                    for step in saved.steps:
                        steps.put_nowait({"event": "step", "trace": 0, **step, "restored": True})
                solution = await solve(
                    graph,
                    job.question,
                    system_prompt=job.system_prompt,
                    context=job.context,
                    config=config,
                    on_step=steps.put_nowait,
                    # A kill loses the node in flight, no more (nothing to write without a key).
                    durability="sync" if config is not None else None,
                )
            trace = trace_of(solution.output)
            await durable.finished(ticket, trace)
            outcome: Outcome = "new" if saved.new else "resumed"
            return RunResult(trace, usage_since(trace.get("usage") or {}, saved.usage), outcome)
        except asyncio.CancelledError:
            if (answer := durable.take_lost(ticket)) is not None:
                # Free the row if this claim still holds it (its lease went unconfirmed, so a
                # retry need not wait it out); one claimed over is another's: nothing changes.
                await durable.stopped(ticket, f"stopped: {answer.message}")
                raise answer from None
            await durable.stopped(ticket, "stopped: the client went away or the endpoint stopped")
            raise
        except ClaimLost:  # claimed over while its lease renewals could not say so
            durable.refused(ticket)
            raise lease_lost(ticket.key) from None
        except Exception as exc:
            await durable.stopped(ticket, f"failed: {self.failure(exc).message}")
            raise
        finally:
            steps.put_nowait(END)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self.in_flight -= 1
        self.runs.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("run %s failed: %s", task.get_name(), self.failure(task.exception()))

    def failure(self, exc: BaseException | None) -> APIError:
        """The answer for a run that failed: its own APIError (409 taken over, 503), 503
        naming the database when the checkpointer stopped answering, else 502 (e.g. an
        unreachable backbone, named by URL)."""
        if isinstance(exc, APIError):
            return exc
        if exc is not None and self.store is not None and self.store.is_outage(exc):
            return unavailable(exc, self.store.target)
        message = describe_failure(exc, self.roles) if exc else "the run ended without a result"
        return APIError(502, message, type_="server_error", code="upstream_error")


async def until_disconnected(receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> None:
    """Return when the client disconnects (ASGI `http.disconnect`), after the body was read."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(
    awaitable: Awaitable[T], receive: Callable[[], Awaitable[Mapping[str, Any]]], run: Run
) -> T:
    """Await `awaitable`; if the client disconnects first, cancel `run` and raise ClientGone."""
    waited = asyncio.ensure_future(awaitable)
    gone = asyncio.create_task(until_disconnected(receive))
    try:
        await asyncio.wait({waited, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server shuts down: the run goes too
        waited.cancel()
        run.task.cancel()
        raise
    finally:
        gone.cancel()
    if not waited.done():
        waited.cancel()
        run.task.cancel()
        raise ClientGone()
    return waited.result()


def run_was_drained(run: Run, service: RunService) -> bool:
    """Whether `run` was cancelled by the service's drain, while the request that awaits it
    goes on (it is not itself being cancelled): that request is answered 503, retry to
    resume."""
    current = asyncio.current_task()
    cancelling = current.cancelling() if current is not None else 0
    return run.task.cancelled() and not service.accepting and cancelling == 0


def describe_model(model: Any) -> dict[str, Any]:
    return {
        "base_url": base_url_of(model),
        "model": getattr(model, "model_name", None) or type(model).__name__,
    }
