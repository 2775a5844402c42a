"""Drain on deploy: the first SIGTERM (or Ctrl-C) stops taking runs, lets the runs in flight
finish within a grace period and cancels the rest, whose checkpoints stay behind for a retry
on another replica; then the process exits 0. A second signal exits at once.

uvicorn's own shutdown closes the listening socket first, so a request arriving during the
grace period would find the port closed and a load balancer could not tell "draining" from
"dead". Here the socket stays open until the runs are done: a new run gets 503 with
Retry-After (vllm-router retries it on another replica), /health answers 503 so health checks
take the replica out, and only then does uvicorn shut down as usual.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import FrameType
from typing import Protocol

import uvicorn

log = logging.getLogger("mur.endpoint")

DEFAULT_GRACE_SECONDS = 30.0
"""How long runs in flight may go on after the first signal (a deploy's usual window)."""


class Drainable(Protocol):
    """What draining needs from the service that owns the runs."""

    @property
    def in_flight(self) -> int: ...

    def stop_taking_runs(self) -> None:
        """From now on a new run is refused with 503 and Retry-After."""

    async def cancel_runs(self) -> int:
        """Cancel every run still in flight and wait until each has stopped (its checkpoint
        written, its lease given up); return how many were cancelled."""


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal drains the runs before shutting down."""

    def __init__(
        self, config: uvicorn.Config, service: Drainable, grace_s: float = DEFAULT_GRACE_SECONDS
    ) -> None:
        super().__init__(config)
        self.service, self.grace_s = service, grace_s
        self.draining = False
        self.forced = False
        self.cancelled = 0
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not uvicorn's handler: it would stop listening at once and re-raise the signal after
        # shutdown, so the process would die of SIGTERM instead of exiting 0.
        if self.draining:
            log.warning("second signal: exiting now; unfinished runs resume from checkpoints")
            self.forced = self.force_exit = self.should_exit = True
            return
        self.draining = True
        self.service.stop_taking_runs()
        log.warning(
            "draining: no new runs; %d in flight get %.0f s to finish",
            self.service.in_flight,
            self.grace_s,
        )
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self.drain())

    async def drain(self) -> None:
        """Wait for the runs in flight (at most the grace period), cancel the rest, exit."""
        deadline = time.monotonic() + self.grace_s
        while self.service.in_flight and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.1)
        if self.service.in_flight and not self.force_exit:
            self.cancelled = await self.service.cancel_runs()
            log.warning("drained: %d runs cancelled, resumable from checkpoints", self.cancelled)
        self.should_exit = True
