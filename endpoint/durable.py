"""Runs that outlive the replica running them: claims in the run ledger, leases renewed while a
run executes, finished replies kept for retries, and pruning.

A replica claims a run before it starts (endpoint/ledger.py): a new key, a run that stopped
(failed, cancelled, drained: its checkpoints resume it), or one whose owner stopped renewing its
lease (the replica died) once that lease has expired. While the run executes the replica renews
the leases of all its runs every `lease_seconds / 3`; a run whose lease it finds lost (claimed
over after this one stalled for a whole lease, by another replica or by a retry reaching this
one) is cancelled at once, so two claims never go on with one thread for longer than a renewal
period. Every write is fenced by the claim it belongs to (`Claim`), not by the replica: only the
claim still holding the run may renew it, record its reply, free it or write its checkpoints
(persistence.fence's `FencedSaver`), so a claimed-over run stops at its next checkpoint even
when its renewals cannot reach the database.

A run without a key is not claimed and not checkpointed: nobody can ask for it again, so
nothing could resume it or replay its reply, and no other replica can claim a thread id that is
fresh. It gets a ticket without a claim (no ledger row, no lease, nothing to renew, free or
prune) and runs on a graph without a checkpointer (endpoint/runs.py); drain and a client that
goes away cancel its task, which needs no row. What that saves is measured in docs/faults.md
(the row of a request without an Idempotency-Key) and BENCHMARKS.md (`mur bench client`'s
endpoint arms, keyed and not).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
)

from mur.endpoint.errors import APIError
from mur.endpoint.idempotency import thread_id_of
from mur.endpoint.refusals import busy, expired, key_reused, lease_lost, unavailable
from mur.persistence.checkpointers import CheckpointerError
from mur.persistence.fence import CLAIM_KEY
from mur.persistence.ledger import Claim, RunLedger

log = logging.getLogger("mur.endpoint")
CLAIM_ATTEMPTS = 3
UNCONFIRMED_MARGIN = 1 / 6
"""A run whose lease no renewal has confirmed for (1 - this) of a lease is stopped, and this
share of a lease is how often that is looked at: it stops before the lease could lapse."""


def check_periods(lease_seconds: float, keep_finished: float) -> None:
    """ValueError unless lease_seconds > 0 and keep_finished >= lease_seconds: a stopped run
    is kept at least a lease for its retry to resume, and pruning takes a running run only
    after its lease has been over that long (two lease periods without a renewal)."""
    if not lease_seconds > 0 or not keep_finished >= lease_seconds:
        raise ValueError(
            f"lease_seconds must be > 0 and keep_finished at least lease_seconds, got "
            f"{lease_seconds} and {keep_finished}"
        )


@dataclass(frozen=True)
class Ticket:
    """A run this replica executes: its thread, the request's idempotency key, its reply's
    id and time (kept with the reply, so a retry gets the same ones), and the claim that
    fences its writes. A keyless run (`key` None) has no claim: it is in no ledger and writes
    no checkpoint; its fresh thread id only names its model calls' session."""

    thread_id: str
    key: str | None
    cid: str
    created: int
    claim: Claim | None

    def config(self) -> RunnableConfig | None:
        """The run's graph config: its thread, and its claim for FencedSaver; None for a
        keyless run (its graph has no checkpointer)."""
        if self.claim is None:
            return None
        return {"configurable": {"thread_id": self.thread_id, CLAIM_KEY: self.claim}}


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
        check_periods(lease_seconds, keep_finished)
        self.ledger, self.saver, self.replica_id = ledger, saver, replica_id
        self.lease_seconds, self.keep_finished = lease_seconds, keep_finished
        self.prune_every = prune_every or min(max(keep_finished / 2, 0.5), 300.0)
        self.watched: dict[Ticket, asyncio.Task[Any]] = {}
        """The runs executing here, one per claim: two claims of one thread (a retry that
        reached this replica after the first claim's lease lapsed) are two entries."""
        self.confirmed: dict[Ticket, float] = {}
        """When (monotonic, this side's clock) each watched claim's lease was last known to
        run a whole lease from: the start of its claim or of its last renewal."""
        self.lost: dict[Ticket, APIError] = {}
        """The runs this replica stopped, and what their clients are told."""
        self._loops: list[asyncio.Task[None]] = []

    async def claim(self, caller: str, key: str | None, fingerprint: str) -> Ticket | StoredReply:
        """This request's run, claimed for this replica; or the stored reply of its finished
        run. APIError 409 (running elsewhere), 422 (key reused), 503 (database down). A
        keyless run is not claimed: its ticket has no claim and the database is not asked."""
        thread_id = thread_id_of(caller, key)
        if key is None:
            return Ticket(
                thread_id, None, f"chatcmpl-mur-{uuid.uuid4().hex}", int(time.time()), None
            )
        try:
            for _ in range(CLAIM_ATTEMPTS):  # the row may change between claim and read
                asked = time.monotonic()
                claim = await self.ledger.claim(
                    thread_id, fingerprint, self.replica_id, self.lease_seconds
                )
                if claim is not None:
                    self._supersede(claim)
                    cid = f"chatcmpl-mur-{uuid.uuid4().hex}"
                    ticket = Ticket(thread_id, key, cid, int(time.time()), claim)
                    self.confirmed[ticket] = asked
                    return ticket
                entry = await self.ledger.entry(thread_id)
                if entry is None:
                    continue  # pruned meanwhile: claim it anew
                if entry.fingerprint != fingerprint:
                    raise key_reused(key)
                if entry.status == "finished" and entry.reply is not None:
                    return StoredReply(**entry.reply)
                if entry.status == "pruning":
                    raise expired(key)
                if entry.status == "running" and entry.lease_left > 0:
                    raise busy(key, entry.lease_left)
        except CheckpointerError as exc:
            raise unavailable(exc) from None
        raise busy(key, 1)

    def _supersede(self, claim: Claim) -> None:
        """Cancel this replica's runs of `claim`'s thread under older claims: their lease
        lapsed (their renewals failed) and a retry claimed the run here again."""
        for ticket, task in list(self.watched.items()):
            if ticket.thread_id == claim.thread_id and ticket.claim != claim:
                why = f"claimed again here (claim {claim.number})"
                self._lose(ticket, task, why, lease_lost(ticket.key))

    def _lose(self, ticket: Ticket, task: asyncio.Task[Any], why: str, answer: APIError) -> None:
        number = ticket.claim.number if ticket.claim is not None else None
        log.warning("run %s: claim %s lost, %s: stopping it", ticket.thread_id, number, why)
        self.lost[ticket] = answer
        self._unwatch(ticket)
        task.cancel()

    def _unwatch(self, ticket: Ticket) -> None:
        self.watched.pop(ticket, None)
        self.confirmed.pop(ticket, None)

    def watch(self, ticket: Ticket, task: asyncio.Task[Any]) -> None:
        """Renew `ticket`'s lease while `task` runs; cancel `task` if the lease is lost. A
        keyless run has no lease: it is not watched."""
        if ticket.claim is not None:
            self.watched[ticket] = task

    def take_lost(self, ticket: Ticket) -> APIError | None:
        """What to answer for `ticket`'s run if this replica cancelled it because its lease
        was lost or could not be renewed (asked once); None if it did not."""
        return self.lost.pop(ticket, None)

    def refused(self, ticket: Ticket) -> None:
        """Stop watching a run whose checkpoint was refused (ClaimLost): its claim is over,
        so its row is another claim's (or gone) and is left alone."""
        self._unwatch(ticket)
        self.lost.pop(ticket, None)
        number = ticket.claim.number if ticket.claim is not None else None
        log.warning(
            "run %s: claim %s lost, its checkpoint refused: stopped", ticket.thread_id, number
        )

    async def finished(self, ticket: Ticket, trace: dict[str, Any]) -> None:
        """Record the reply for retries (a keyless run has nothing to record). APIError 409
        when the run was claimed over: the new claim's reply, not this one, is the run's."""
        self._unwatch(ticket)
        if ticket.claim is None:
            return
        reply = {"cid": ticket.cid, "created": ticket.created, "trace": trace}
        try:
            recorded = await self.ledger.finish(ticket.claim, reply)
        except CheckpointerError as exc:
            raise unavailable(exc) from None
        if not recorded:
            raise lease_lost(ticket.key)

    async def stopped(self, ticket: Ticket, why: str) -> None:
        """Free a run that ended without a result, so a retry resumes it at once (a keyless
        run holds nothing to free); a claim that was claimed over frees nothing. Never raises:
        a run it cannot free is freed by its lease expiring."""
        self._unwatch(ticket)
        if ticket.claim is None:
            return
        try:
            await self.ledger.stop(ticket.claim, why)
        except Exception as exc:  # the database is down, or the loop is closing
            log.warning("could not free run %s (%s): its lease will expire", ticket.thread_id, exc)

    async def forget(self, thread_id: str) -> None:
        """Delete a run's checkpoints, then its ledger row."""
        await self.saver.adelete_thread(thread_id)
        await self.ledger.delete(thread_id)

    async def prune(self) -> int:
        """Delete the runs ended more than `keep_finished` s ago (and abandoned ones); how many.
        A holder of an abandoned one that lives on writes no checkpoint after it (FencedSaver)."""
        threads = await self.ledger.mark_prunable(self.keep_finished)
        for thread_id in threads:
            await self.forget(thread_id)
        return len(threads)

    async def renew(self) -> None:
        """Extend this replica's leases; cancel the runs whose claim was claimed over. A task
        that ended without saying so (cancelled before it started, so none of its handlers
        ran) is dropped: its lease expires."""
        for ticket in [ticket for ticket, task in self.watched.items() if task.done()]:
            self._unwatch(ticket)
        asked = dict(self.watched)
        claims = [ticket.claim for ticket in asked if ticket.claim is not None]  # all: watched
        started = time.monotonic()
        held = await self.ledger.renew(self.lease_seconds, claims)
        # Judge only the runs asked about and still watched by the same task: one that ended
        # meanwhile stopped being watched before its row changed, one claimed meanwhile was
        # not asked about. What is left and was not renewed was claimed over.
        for ticket, task in asked.items():
            if self.watched.get(ticket) is not task or task.done():
                continue
            if ticket.claim in held:
                self.confirmed[ticket] = started
            else:
                why = "claimed over (its lease had lapsed)"
                self._lose(ticket, task, why, lease_lost(ticket.key))

    def stop_unconfirmed(self) -> None:
        """Stop the runs whose lease could lapse before a renewal confirms it (the database
        has not answered for most of a lease): before another replica may take one over, so
        that two claims never go on with one thread. Their clients get 503; a retry with the
        key resumes the run after its last checkpoint."""
        deadline = time.monotonic() - self.lease_seconds * (1 - UNCONFIRMED_MARGIN)
        for ticket, task in list(self.watched.items()):
            if self.confirmed.get(ticket, deadline) < deadline and not task.done():
                why = f"its lease was not renewed for {self.lease_seconds:g} s"
                answer = unavailable(
                    CheckpointerError(
                        f"the checkpointer database {self.ledger.db.shown} did not renew this "
                        f"run's lease for {self.lease_seconds * (1 - UNCONFIRMED_MARGIN):.1f} s, "
                        "so it was stopped before another replica could take it over"
                    )
                )
                self._lose(ticket, task, why, answer)

    def start(self) -> None:
        """Start renewing leases and pruning, in the running loop."""
        self._loops = [
            asyncio.create_task(self._every(self.lease_seconds / 3, self.renew), name="leases"),
            asyncio.create_task(
                self._every(self.lease_seconds * UNCONFIRMED_MARGIN, self._stop_unconfirmed),
                name="unconfirmed leases",
            ),
            asyncio.create_task(self._every(self.prune_every, self.prune), name="prune"),
        ]

    async def close(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)

    async def _stop_unconfirmed(self) -> None:
        self.stop_unconfirmed()

    @staticmethod
    async def _every(seconds: float, action: Any) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await action()
            except Exception as exc:  # a database outage must not end the loop
                log.warning("%s failed: %s", getattr(action, "__name__", action), exc)
