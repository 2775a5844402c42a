"""Graph runs: the compiled graphs, the one place a request's run starts (`RunService.start`),
the limit on runs in flight, and how a run is given up when its client goes away.

A run is an asyncio task of its own, not an async generator resumed from the response: that
keeps LangGraph's context variables in one task, and lets a disconnect cancel it. Cancelling
the task cancels the model call in flight (its HTTP request is closed, and vLLM aborts a
request whose client has gone), so a run stops within the step it was in.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel

from mur.endpoint.errors import APIError
from mur.endpoint.replies import trace_of
from mur.endpoint.schemas import Job
from mur.graphs import build_graph
from mur.graphs.model_calls import describe_failure, server_roles
from mur.graphs.solve import solve
from mur.servers.clients import base_url_of
from mur.servers.sessions import new_session_id, session

log = logging.getLogger("mur.endpoint")
T = TypeVar("T")

END = None
"""Put in a run's step queue after its last step (or when it fails or is cancelled)."""


@dataclass
class Run:
    """A started run: its task (returning the trace, or raising) and its kept steps."""

    job: Job
    task: asyncio.Task[dict[str, Any]]
    steps: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


class Saturated(APIError):
    """429: every run slot is taken; the client should retry after `retry_after` seconds."""

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(
            429,
            f"the MUR endpoint is running its limit of {limit} solutions: retry after "
            f"{retry_after} s",
            type_="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry_after)},
        )


class ClientGone(Exception):
    """The client disconnected before the run ended; its run was cancelled."""


class RunService:
    """The compiled graph (built on first use) and the runs over it."""

    def __init__(
        self,
        backbone: BaseChatModel,
        verifier: BaseChatModel | None = None,
        *,
        max_runs: int = 64,
        retry_after: int = 1,
    ) -> None:
        if max_runs < 1 or retry_after < 1:
            raise ValueError(
                f"max_runs and retry_after must be >= 1, got {max_runs} and {retry_after}"
            )
        self.backbone = backbone
        self.verifier = verifier or backbone
        self.max_runs, self.retry_after = max_runs, retry_after
        self.in_flight = 0
        self._graph: Any = None
        self.roles = server_roles(self.backbone, self.verifier)  # for error messages

    def graph(self) -> Any:
        """The compiled graph, every strategy in it; built once (no await in here, so no
        race)."""
        if self._graph is None:
            self._graph = build_graph(backbone=self.backbone, verifier=self.verifier)
        return self._graph

    def start(self, job: Job) -> Run:
        """Start the graph run of `job` in a task of its own; 429 when every slot is taken.

        The slot is held until the task ends (finished, failed or cancelled).
        """
        if self.in_flight >= self.max_runs:
            raise Saturated(self.max_runs, self.retry_after)
        graph = self.graph()
        steps: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def run() -> dict[str, Any]:
            try:
                # One session per completion: a router keeps this question on one replica.
                with session(new_session_id("mur-endpoint", uuid.uuid4().hex[:12])):
                    solution = await solve(
                        graph,
                        job.question,
                        system_prompt=job.system_prompt,
                        context=job.context,
                        on_step=steps.put_nowait,
                    )
            finally:
                steps.put_nowait(END)
            return trace_of(solution.output)

        task = asyncio.create_task(run(), name=job.model)
        self.in_flight += 1
        task.add_done_callback(self._ended)
        return Run(job, task, steps)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self.in_flight -= 1
        if not task.cancelled() and task.exception() is not None:
            log.warning("run %s failed: %s", task.get_name(), self.failure(task.exception()))

    def failure(self, exc: BaseException | None) -> APIError:
        """502 for a run that failed (e.g. an unreachable backbone, named by URL)."""
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


def describe_model(model: Any) -> dict[str, Any]:
    return {
        "base_url": base_url_of(model),
        "model": getattr(model, "model_name", None) or type(model).__name__,
    }
