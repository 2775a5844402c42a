"""The run ledger: one row per endpoint run, in the checkpointer's own database (SQLite or
PostgreSQL, the same SQL), so every replica sees who runs what.

A row holds the run's thread id (its key), the request's fingerprint, its status (`running`,
`finished`, `failed`: stopped without a result, its checkpoints resume it; `pruning`: being
deleted), the replica that owns it and until when (its lease, renewed while it runs), how often
it was claimed, and a finished run's reply. Every change is one atomic statement: a claim is an
INSERT ... ON CONFLICT DO UPDATE ... WHERE (the run is free) RETURNING, so of two replicas
claiming one run exactly one gets a row back. Times are the database's clock (`Database.now`),
one clock for all replicas.

A claim is fenced: it returns a `Claim` (the row's claim count and creation time, and the
owner), and every later write of its holder is conditioned, in the database, on the row
still being that claim: renew, finish and stop are one UPDATE each with the claim in its
WHERE; the checkpoints of persistence/fence.py's `FencedSaver` are written inside `fenced`, a
transaction that first locks the row as that claim (SELECT ... FOR SHARE, which a claim's or
a prune's UPDATE waits for; SQLite's one writer). A holder that stalled past its lease and
was claimed over, even by its own replica, then changes nothing, and nothing it wrote while
it held the claim is ever removed: the owner alone cannot tell two claims of one replica
apart.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from mur.persistence.checkpointers import Database

TABLE = "mur_runs"
SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        thread_id TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        status TEXT NOT NULL,
        owner TEXT NOT NULL,
        lease_expires DOUBLE PRECISION NOT NULL,
        claims INTEGER NOT NULL,
        reply TEXT,
        error TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    )""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_owner ON {TABLE} (owner, status)",
)
"""The ledger's DDL, run with the checkpointer's own setup (open_checkpointer's `schema`); a
table made by an older version is brought up to it by `RunLedger.upgrade`."""

PRUNING_LEASE_SECONDS = 300.0
"""A row marked for pruning by a replica that died before deleting it is pruned again after
this long."""

Status = Literal["running", "finished", "failed", "pruning"]
RENEW_BATCH = 200
"""Claims renewed per statement: 4 parameters each, below SQLite's oldest limit (999)."""

FENCE = "(thread_id = ? AND owner = ? AND claims = ? AND created_at = ?)"
"""The SQL condition that a row is still one claim (its parameters: `Claim.params`)."""


@dataclass(frozen=True)
class Claim:
    """One claim of a run, the fence every write of its holder carries: the row's thread, its
    owner, how often it had been claimed (`number`) and when the row was created (`created`, the
    database's clock: a row pruned and inserted anew counts its claims from 1 again, so the
    number alone could match an old claim)."""

    thread_id: str
    owner: str
    number: int
    created: float

    def params(self) -> tuple[str, str, int, float]:
        """The parameters of FENCE for this claim."""
        return (self.thread_id, self.owner, self.number, self.created)


class ClaimLost(Exception):
    """A write refused: its claim no longer holds the run (claimed over after a stall, or
    pruned). The run stops there; the holder of the new claim goes on."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(
            f"run {claim.thread_id}: claim {claim.number} of {claim.owner} no longer holds it, "
            "its checkpoint is refused"
        )
        self.claim = claim


@dataclass(frozen=True)
class Entry:
    """A ledger row as a claim that did not succeed reads it."""

    thread_id: str
    fingerprint: str
    status: Status
    owner: str
    lease_left: float  # seconds until the lease expires (<= 0: expired)
    claims: int
    reply: dict[str, Any] | None
    error: str | None


class RunLedger:
    """The ledger's statements over one `Database`."""

    def __init__(self, database: Database) -> None:
        self.db = database
        self.now = database.now

    async def upgrade(self) -> None:
        """Drop the `keyed` column of a ledger made by an older version: always 1, and NOT NULL
        without a default, so it would refuse every claim. Looked up first, so that a current
        ledger is not locked; one upgrader at a time (SQLite's write lock; IF EXISTS for a
        concurrent one on PostgreSQL). SQLite drops columns since 3.35, as RETURNING needs."""
        if self.db.dialect == "sqlite":
            columns, drop = f"SELECT name FROM pragma_table_info('{TABLE}')", "DROP COLUMN"
        else:
            columns = f"""SELECT column_name FROM information_schema.columns
                WHERE table_name = '{TABLE}' AND table_schema = current_schema()"""
            drop = "DROP COLUMN IF EXISTS"
        async with self.db.transaction() as transaction:
            if ("keyed",) in await transaction.execute(columns):
                await transaction.execute(f"ALTER TABLE {TABLE} {drop} keyed")

    async def claim(
        self, thread_id: str, fingerprint: str, owner: str, lease: float
    ) -> Claim | None:
        """Take the run for `owner` until now + `lease`: a new run, or one that is free (failed,
        or running under an expired lease) with the same fingerprint. Returns the claim (its
        `number`: how often the run has now been claimed, 1: new), or None when it is not free
        or not the same request."""
        rows = await self.db.execute(
            f"""INSERT INTO {TABLE} (thread_id, fingerprint, status, owner,
                    lease_expires, claims, created_at, updated_at)
                VALUES (?, ?, 'running', ?, {self.now} + ?, 1, {self.now}, {self.now})
                ON CONFLICT (thread_id) DO UPDATE SET
                    status = 'running', owner = excluded.owner,
                    lease_expires = excluded.lease_expires, claims = {TABLE}.claims + 1,
                    error = NULL, updated_at = excluded.updated_at
                WHERE {TABLE}.fingerprint = excluded.fingerprint
                    AND ({TABLE}.status = 'failed'
                         OR ({TABLE}.status = 'running' AND {TABLE}.lease_expires < {self.now}))
                RETURNING claims, created_at""",
            (thread_id, fingerprint, owner, lease),
        )
        return Claim(thread_id, owner, int(rows[0][0]), float(rows[0][1])) if rows else None

    async def entry(self, thread_id: str) -> Entry | None:
        rows = await self.db.execute(
            f"""SELECT thread_id, fingerprint, status, owner, lease_expires - {self.now},
                    claims, reply, error
                FROM {TABLE} WHERE thread_id = ?""",
            (thread_id,),
        )
        if not rows:
            return None
        thread, fingerprint, status, owner, left, claims, reply, error = rows[0]
        stored = json.loads(reply) if reply else None
        return Entry(thread, fingerprint, status, owner, float(left), int(claims), stored, error)

    async def renew(self, lease: float, claims: Collection[Claim]) -> set[Claim]:
        """Extend by `lease` s from now the leases of `claims` (the runs this replica is
        executing: a run whose task ended but whose row could not be freed is left to expire);
        those still held, each by the same claim (one claimed over, even by the same owner,
        is not renewed)."""
        held: set[Claim] = set()
        listed = list(claims)
        for start in range(0, len(listed), RENEW_BATCH):
            batch = listed[start : start + RENEW_BATCH]
            fences = " OR ".join(FENCE for _ in batch)
            rows = await self.db.execute(
                f"""UPDATE {TABLE} SET lease_expires = {self.now} + ?, updated_at = {self.now}
                    WHERE status = 'running' AND ({fences})
                    RETURNING thread_id, claims""",
                (lease, *(param for claim in batch for param in claim.params())),
            )
            renewed = {(thread_id, int(number)) for thread_id, number in rows}
            held.update(c for c in batch if (c.thread_id, c.number) in renewed)
        return held

    @asynccontextmanager
    async def fenced(self, claim: Claim) -> AsyncIterator[None]:
        """A transaction in which `claim` holds its run (running, not claimed over, not being
        pruned), whatever its lease says, with the row locked until it ends: the writes made
        inside land only if the claim still holds when they commit, and a takeover or a prune
        waits until they have. ClaimLost when the claim no longer holds."""
        async with self.db.transaction() as transaction:
            rows = await transaction.execute(
                f"SELECT 1 FROM {TABLE} WHERE status = 'running' AND {FENCE}{transaction.row_lock}",
                claim.params(),
            )
            if not rows:
                raise ClaimLost(claim)
            yield

    async def finish(self, claim: Claim, reply: dict[str, Any]) -> bool:
        """Record the run's reply, if `claim` still holds it (else it was claimed over: False)."""
        return await self._end(claim, "finished", json.dumps(reply), None)

    async def stop(self, claim: Claim, error: str) -> bool:
        """Mark the run failed (free to resume at once), if `claim` still holds it."""
        return await self._end(claim, "failed", None, error[:2000])

    async def _end(
        self, claim: Claim, status: Status, reply: str | None, error: str | None
    ) -> bool:
        rows = await self.db.execute(
            f"""UPDATE {TABLE} SET status = ?, reply = ?, error = ?, lease_expires = 0,
                    updated_at = {self.now}
                WHERE status = 'running' AND {FENCE} RETURNING thread_id""",
            (status, reply, error, *claim.params()),
        )
        return bool(rows)

    async def mark_prunable(self, keep_finished: float) -> list[str]:
        """Mark for deletion the runs ended more than `keep_finished` s ago, those whose
        lease expired that long ago (their replica died and no retry came), and those another
        pruner marked and left; their thread ids. A running row is never marked while its lease
        lasts; its holder, if it lives on, then writes nothing (the claim no longer holds), and
        DurableRuns keeps `keep_finished` at least one lease, so that this is at least two
        lease periods without a renewal."""
        rows = await self.db.execute(
            f"""UPDATE {TABLE} SET status = 'pruning', lease_expires = {self.now} + ?,
                    updated_at = {self.now}
                WHERE (status IN ('finished', 'failed') AND updated_at < {self.now} - ?)
                   OR (status = 'running' AND lease_expires < {self.now} - ?)
                   OR (status = 'pruning' AND lease_expires < {self.now})
                RETURNING thread_id""",
            (PRUNING_LEASE_SECONDS, keep_finished, keep_finished),
        )
        return [row[0] for row in rows]

    async def delete(self, thread_id: str) -> None:
        """Remove a run's row (after its checkpoints)."""
        await self.db.execute(f"DELETE FROM {TABLE} WHERE thread_id = ?", (thread_id,))
