"""Runs that outlive the replica running them: claims in the run ledger, leases renewed while a
run executes, finished replies kept for retries, and pruning.

A replica claims a run before it starts (endpoint/ledger.py): a new key, a run that stopped
(failed, cancelled, drained: its checkpoints resume it), or one whose owner stopped renewing its
lease (the replica died) once that lease has expired. While the run executes the replica renews
the leases of all its runs every `lease_seconds / 3`; a run whose lease it finds lost (another
replica took it over after this one stalled for a whole lease) is cancelled at once, so two
replicas never go on with one thread for longer than a renewal period, and only the replica
still holding the lease may record a reply. A run without a key gets a fresh thread of its
own, checkpointed like any other and deleted once it ends (nobody can ask for it again).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from mur.endpoint.idempotency import thread_id_of
from mur.endpoint.ledger import RunLedger
from mur.endpoint.refusals import busy, key_reused, lease_lost, unavailable
from mur.graphs.checkpointers import CheckpointerError

log = logging.getLogger("mur.endpoint")
CLAIM_ATTEMPTS = 3


@dataclass(frozen=True)
class Ticket:
    """A run this replica holds: its thread, the request's idempotency key (None: keyless)
    and its reply's id and time (kept with the reply, so a retry gets the same ones)."""

    thread_id: str
    key: str | None
    cid: str
    created: int


@dataclass(frozen=True)
class StoredReply:
    """A finished run's reply, as recorded: what a retry with its key gets back."""

    cid: str
    created: int
    trace: dict[str, Any]


class DurableRuns:
    """This replica's side of the ledger: its claims, its leases, the replies it records, and
    the periodic pruning (runs ended more than `keep_finished` s ago, with their checkpoints)."""

    def __init__(
        self,
        ledger: RunLedger,
        saver: BaseCheckpointSaver[Any],
        *,
        replica_id: str,
        lease_seconds: float,
        keep_finished: float,
        prune_every: float | None = None,
    ) -> None:
        if lease_seconds <= 0 or keep_finished < 0:
            raise ValueError(
                f"lease_seconds must be > 0 and keep_finished >= 0, got {lease_seconds} and "
                f"{keep_finished}"
            )
        self.ledger, self.saver, self.replica_id = ledger, saver, replica_id
        self.lease_seconds, self.keep_finished = lease_seconds, keep_finished
        self.prune_every = prune_every or min(max(keep_finished / 2, 0.5), 300.0)
        self.watched: dict[str, asyncio.Task[Any]] = {}
        self.lost: set[str] = set()
        self._loops: list[asyncio.Task[None]] = []

    async def claim(self, caller: str, key: str | None, fingerprint: str) -> Ticket | StoredReply:
        """This request's run, claimed for this replica; or the stored reply of its finished
        run. APIError 409 (running elsewhere), 422 (key reused), 503 (database down)."""
        thread_id = thread_id_of(caller, key)
        try:
            for _ in range(CLAIM_ATTEMPTS):  # the row may change between claim and read
                claims = await self.ledger.claim(
                    thread_id, fingerprint, key is not None, self.replica_id, self.lease_seconds
                )
                if claims is not None:
                    return Ticket(
                        thread_id, key, f"chatcmpl-mur-{uuid.uuid4().hex}", int(time.time())
                    )
                entry = await self.ledger.entry(thread_id)
                if entry is None:
                    continue  # pruned meanwhile: claim it anew
                assert key is not None  # a keyless thread id is fresh: its claim cannot fail
                if entry.fingerprint != fingerprint:
                    raise key_reused(key)
                if entry.status == "finished" and entry.reply is not None:
                    return StoredReply(**entry.reply)
                if entry.status in ("running", "pruning") and entry.lease_left > 0:
                    raise busy(key, entry.lease_left)
        except CheckpointerError as exc:
            raise unavailable(exc) from None
        raise busy(key or "", 1)

    def watch(self, ticket: Ticket, task: asyncio.Task[Any]) -> None:
        """Renew `ticket`'s lease while `task` runs; cancel `task` if the lease is lost."""
        self.watched[ticket.thread_id] = task

    def take_lost(self, ticket: Ticket) -> bool:
        """Whether `ticket`'s run was cancelled because its lease was lost (asked once)."""
        if ticket.thread_id in self.lost:
            self.lost.discard(ticket.thread_id)
            return True
        return False

    async def finished(self, ticket: Ticket, trace: dict[str, Any]) -> None:
        """Record the reply for retries (a keyless run is deleted instead). APIError 409 when
        another replica holds the run now: its reply, not this one, is the run's."""
        self.watched.pop(ticket.thread_id, None)
        if ticket.key is None:
            await self._forget_quietly(ticket.thread_id)
            return
        reply = {"cid": ticket.cid, "created": ticket.created, "trace": trace}
        try:
            recorded = await self.ledger.finish(ticket.thread_id, self.replica_id, reply)
        except CheckpointerError as exc:
            raise unavailable(exc) from None
        if not recorded:
            raise lease_lost(ticket.key)

    async def stopped(self, ticket: Ticket, why: str) -> None:
        """Free a run that ended without a result, so a retry resumes it at once (a keyless
        run is deleted). Never raises: a run it cannot free is freed by its lease expiring."""
        self.watched.pop(ticket.thread_id, None)
        if ticket.key is None:
            await self._forget_quietly(ticket.thread_id)
            return
        try:
            await self.ledger.stop(ticket.thread_id, self.replica_id, why)
        except Exception as exc:  # the database is down, or the loop is closing
            log.warning("could not free run %s (%s): its lease will expire", ticket.thread_id, exc)

    async def _forget_quietly(self, thread_id: str) -> None:
        """Delete a keyless run; when that fails the pruner deletes it once its lease has
        expired and `keep_finished` has passed."""
        try:
            await self.forget(thread_id)
        except Exception as exc:
            log.warning("could not delete run %s (%s): it will be pruned", thread_id, exc)

    async def forget(self, thread_id: str) -> None:
        """Delete a run's checkpoints, then its ledger row."""
        await self.saver.adelete_thread(thread_id)
        await self.ledger.delete(thread_id)

    async def prune(self) -> int:
        """Delete the runs ended more than `keep_finished` s ago (and abandoned ones); how many."""
        threads = await self.ledger.mark_prunable(self.keep_finished)
        for thread_id in threads:
            await self.forget(thread_id)
        return len(threads)

    async def renew(self) -> None:
        """Extend this replica's leases; cancel the runs whose lease another replica took."""
        asked = dict(self.watched)
        owned = await self.ledger.renew(self.replica_id, self.lease_seconds, list(asked))
        # Judge only the runs asked about and still watched by the same task: one that ended
        # meanwhile stopped being watched before its row changed, one claimed meanwhile was
        # not asked about. What is left and was not renewed belongs to another replica now.
        for thread_id, task in asked.items():
            if self.watched.get(thread_id) is task and thread_id not in owned and not task.done():
                log.warning("run %s: lease lost to another replica, stopping it", thread_id)
                self.lost.add(thread_id)
                del self.watched[thread_id]
                task.cancel()

    def start(self) -> None:
        """Start renewing leases and pruning, in the running loop."""
        self._loops = [
            asyncio.create_task(self._every(self.lease_seconds / 3, self.renew), name="leases"),
            asyncio.create_task(self._every(self.prune_every, self.prune), name="prune"),
        ]

    async def close(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)

    @staticmethod
    async def _every(seconds: float, action: Any) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await action()
            except Exception as exc:  # a database outage must not end the loop
                log.warning("%s failed: %s", getattr(action, "__name__", action), exc)
