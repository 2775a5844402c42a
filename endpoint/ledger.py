"""The run ledger: one row per endpoint run, in the checkpointer's own database (SQLite or
PostgreSQL, the same SQL), so every replica sees who runs what.

A row holds the run's thread id (its key), the request's fingerprint, its status (`running`,
`finished`, `failed`: stopped without a result, its checkpoints resume it; `pruning`: being
deleted), the replica that owns it and until when (its lease, renewed while it runs), how often
it was claimed, and a finished run's reply. Every change is one atomic statement: a claim is an
INSERT ... ON CONFLICT DO UPDATE ... WHERE (the run is free) RETURNING, so of two replicas
claiming one run exactly one gets a row back. Times are the database's clock (`Database.now`),
one clock for all replicas.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from mur.graphs.checkpointers import Database

TABLE = "mur_runs"
SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        thread_id TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        keyed INTEGER NOT NULL,
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
"""The ledger's DDL, run with the checkpointer's own setup (open_checkpointer's `schema`)."""

PRUNING_LEASE_SECONDS = 300.0
"""A row marked for pruning by a replica that died before deleting it is pruned again after
this long."""

Status = Literal["running", "finished", "failed", "pruning"]


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

    async def claim(
        self, thread_id: str, fingerprint: str, keyed: bool, owner: str, lease: float
    ) -> int | None:
        """Take the run for `owner` until now + `lease`: a new run, or one that is free (failed,
        or running under an expired lease) with the same fingerprint. Returns how often it has
        now been claimed (1: new), or None when it is not free or not the same request."""
        rows = await self.db.execute(
            f"""INSERT INTO {TABLE} (thread_id, fingerprint, keyed, status, owner,
                    lease_expires, claims, created_at, updated_at)
                VALUES (?, ?, ?, 'running', ?, {self.now} + ?, 1, {self.now}, {self.now})
                ON CONFLICT (thread_id) DO UPDATE SET
                    status = 'running', owner = excluded.owner,
                    lease_expires = excluded.lease_expires, claims = {TABLE}.claims + 1,
                    error = NULL, updated_at = excluded.updated_at
                WHERE {TABLE}.fingerprint = excluded.fingerprint
                    AND ({TABLE}.status = 'failed'
                         OR ({TABLE}.status = 'running' AND {TABLE}.lease_expires < {self.now}))
                RETURNING claims""",
            (thread_id, fingerprint, int(keyed), owner, lease),
        )
        return int(rows[0][0]) if rows else None

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

    async def renew(self, owner: str, lease: float, threads: Collection[str]) -> set[str]:
        """Extend by `lease` s from now the leases `owner` holds on `threads` (the runs it is
        executing: a run whose task ended but whose row could not be freed is left to expire);
        the threads it still holds."""
        if not threads:
            return set()
        marks = ", ".join("?" for _ in threads)
        rows = await self.db.execute(
            f"""UPDATE {TABLE} SET lease_expires = {self.now} + ?, updated_at = {self.now}
                WHERE owner = ? AND status = 'running' AND thread_id IN ({marks})
                RETURNING thread_id""",
            (lease, owner, *threads),
        )
        return {row[0] for row in rows}

    async def finish(self, thread_id: str, owner: str, reply: dict[str, Any]) -> bool:
        """Record the run's reply, if `owner` still holds it (else another replica took it
        over: False)."""
        return await self._end(thread_id, owner, "finished", json.dumps(reply), None)

    async def stop(self, thread_id: str, owner: str, error: str) -> bool:
        """Mark the run failed (free to resume at once), if `owner` still holds it."""
        return await self._end(thread_id, owner, "failed", None, error[:2000])

    async def _end(
        self, thread_id: str, owner: str, status: Status, reply: str | None, error: str | None
    ) -> bool:
        rows = await self.db.execute(
            f"""UPDATE {TABLE} SET status = ?, reply = ?, error = ?, lease_expires = 0,
                    updated_at = {self.now}
                WHERE thread_id = ? AND owner = ? AND status = 'running' RETURNING thread_id""",
            (status, reply, error, thread_id, owner),
        )
        return bool(rows)

    async def mark_prunable(self, keep_finished: float) -> list[str]:
        """Mark for deletion the runs ended more than `keep_finished` s ago, those whose
        lease expired that long ago (their replica died and no retry came), and those another
        pruner marked and left; their thread ids."""
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
