"""The claim fence kept by PostgreSQL itself (persistence/ledger.py `fenced`, persistence/fence.py
`FencedSaver`), each race staged deterministically on a real server: a table lock held from
a second connection, a holder stalled inside its write's transaction, a frozen server.

- a checkpoint committed under a valid claim is never removed, and a takeover waits for it;
- a holder stalled between the fence's check and its write writes nothing after a takeover or
  a prune: the server ends its idle transaction (persistence.postgres.IDLE_IN_TRANSACTION_S) and the
  takeover or prune goes on, so no checkpoint, blob or task write outlives its ledger row;
- a frozen server: every call gives up (503 naming the database) and a holder stops its run
  before its lease could lapse.

Each fails on the fence that checked around the write (before this change): there the
takeover never waited, the committed checkpoint was deleted, and the stalled write's blobs
stayed behind.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from test_endpoint_fencing import NEVER, QUESTION, config_of, lapse, run_until_held, written_by
from test_endpoint_runs import Backbone

from mur.endpoint.durable import DurableRuns, Ticket
from mur.endpoint.errors import APIError
from mur.graphs import build_graph
from mur.graphs.solve import solve
from mur.persistence.checkpointers import (
    CheckpointerUnavailable,
    CheckpointStore,
    open_checkpointer,
)
from mur.persistence.fence import FencedSaver
from mur.persistence.ledger import SCHEMA, ClaimLost, RunLedger
from mur.persistence.postgres import STATEMENT_TIMEOUT_S
from postgres import PASSWORD, PostgresServer, start

TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


@pytest.fixture
async def url(postgres: PostgresServer) -> str:
    return await asyncio.to_thread(postgres.create_database, f"staged_{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def store(url: str) -> AsyncIterator[CheckpointStore]:
    async with open_checkpointer(url, schema=SCHEMA) as opened:
        yield opened


@pytest.fixture
async def second(url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """Another session on the same database: the test's hand on locks and rows."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    yield conn
    await conn.close()


async def waiting_on_locks(conn: psycopg.AsyncConnection[Any]) -> int:
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def until(condition: Any, timeout: float = 20) -> None:
    """Poll `condition()` (async) until true; fail after `timeout` s (a hang, not a race)."""
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "the staged state was never reached"
        await asyncio.sleep(0.02)


async def rows_of(conn: psycopg.AsyncConnection[Any], thread_id: str) -> dict[str, int]:
    counts = {}
    for table in (*TABLES, "mur_runs"):
        cursor = await conn.execute(
            f"SELECT count(*) FROM {table} WHERE thread_id = %s",  # fixed names
            (thread_id,),
        )
        row = await cursor.fetchone()
        counts[table] = int(row[0]) if row else 0
    return counts


async def test_a_checkpoint_committed_under_its_claim_is_never_removed(
    store: CheckpointStore, second: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder's checkpoint insert waits on a table lock (the second session's) after its
    fence passed; meanwhile its lease lapses and replica B claims the run. B's claim waits
    for the holder's write, which commits; B then resumes after it, and the holder's next
    write is refused. Before, B's claim went through at once and the holder, finding it gone
    after its write, deleted the checkpoint B was about to resume from."""
    ledger = RunLedger(store.database)
    claim = await ledger.claim("run-1", "fp", "replica-a", 30)
    assert claim is not None
    committed: list[str] = []
    put = store.saver.aput

    async def recorded(config: Any, *args: Any) -> Any:
        saved = await put(config, *args)
        committed.append(saved["configurable"]["checkpoint_id"])
        return saved

    monkeypatch.setattr(store.saver, "aput", recorded)
    stalled = Backbone(hold_at=2)
    run = await run_until_held(store, stalled, claim)
    await lapse(store, "run-1")  # the holder stalled past its lease in the model call
    async with second.transaction():
        await second.execute("LOCK TABLE checkpoints IN SHARE MODE")
        stalled.release.set()  # step 2 returns: its checkpoint's insert waits on the lock
        await until(lambda: _waiting(second, 1))
        taking = asyncio.create_task(ledger.claim("run-1", "fp", "replica-b", 30))
        await until(lambda: _waiting_or_done(second, 2, taking))
        assert not taking.done(), "the claim moved while a write of the holder was open"
    taken = await asyncio.wait_for(taking, 20)
    assert taken is not None and taken.number == 2
    with pytest.raises(ClaimLost, match="claim 1 of replica-a no longer holds it"):
        await run
    kept = await store.database.execute(
        "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ?", ("run-1",)
    )
    assert set(committed) <= {row[0] for row in kept}, "a committed checkpoint was removed"
    resumed = Backbone()
    graph = build_graph(backbone=resumed.fake, checkpointer=FencedSaver(store.saver, ledger))
    solution = await solve(graph, QUESTION, context=NEVER, config=config_of(taken))
    assert solution.resumed and solution.output["answer"] == "42"
    assert resumed.asked() == [3], "the new holder did not resume after the holder's step 2"


async def _waiting(conn: psycopg.AsyncConnection[Any], count: int) -> bool:
    return await waiting_on_locks(conn) >= count


async def _waiting_or_done(
    conn: psycopg.AsyncConnection[Any], count: int, task: asyncio.Task[Any]
) -> bool:
    return task.done() or await waiting_on_locks(conn) >= count


def stall_inside_the_write(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, after: int
) -> tuple[asyncio.Event, asyncio.Event]:
    """The holder's `after`-th checkpoint write stops just before its statements (its fence
    passed: a process frozen there); returns (stalled: set once it waits, go: set to go on)."""
    stalled, go = asyncio.Event(), asyncio.Event()
    put = store.saver.aput
    seen = [0]

    async def frozen(config: Any, *args: Any) -> Any:
        seen[0] += 1
        if seen[0] == after:
            stalled.set()
            await go.wait()
        return await put(config, *args)

    monkeypatch.setattr(store.saver, "aput", frozen)
    return stalled, go


async def run_of(store: CheckpointStore, claim: Any) -> asyncio.Task[Any]:
    graph = build_graph(
        backbone=Backbone().fake,
        checkpointer=FencedSaver(store.saver, RunLedger(store.database)),
    )
    return asyncio.create_task(
        solve(graph, QUESTION, context=NEVER, config=config_of(claim), durability="sync")
    )


async def test_a_holder_stalled_inside_its_write_writes_nothing_after_a_takeover(
    store: CheckpointStore, second: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder stalls between its fence's check and its write, its lease lapses, B claims
    the run: B waits until the server ends the holder's idle transaction (within
    IDLE_IN_TRANSACTION_S), then holds the run; the holder, woken, writes nothing (no
    checkpoint, no blob, no task write) and stops."""
    ledger = RunLedger(store.database)
    claim = await ledger.claim("run-2", "fp", "replica-a", 30)
    assert claim is not None
    await lapse(store, "run-2")  # as a stall past the lease leaves it (the fence reads no lease)
    stalled, go = stall_inside_the_write(store, monkeypatch, after=3)
    run = await run_of(store, claim)
    await asyncio.wait_for(stalled.wait(), 20)
    taking = asyncio.create_task(ledger.claim("run-2", "fp", "replica-b", 30))
    await until(lambda: _waiting_or_done(second, 1, taking))
    assert not taking.done(), "the claim moved while the holder's write was open"
    # Taken while the holder still stalls in its write (it goes on only at `go`): only the
    # server's end of its idle transaction (IDLE_IN_TRANSACTION_S) lets B through; without it
    # B's claim would hit its own statement timeout and take nothing.
    taken = await asyncio.wait_for(taking, STATEMENT_TIMEOUT_S + 10)
    assert taken is not None and taken.number == 2
    # Counted once B holds the run: a task write of the holder's still committing when the
    # stall began lands under claim 1, before the takeover (B's claim waits for its row lock),
    # so a count taken earlier could miss it on a loaded machine.
    before = await rows_of(second, "run-2")
    go.set()
    with pytest.raises(CheckpointerUnavailable):
        await run
    assert await rows_of(second, "run-2") == before, "the holder wrote after the takeover"
    assert await written_by(store, "run-2") == [1] * before["checkpoints"]


async def test_a_run_pruned_under_a_stalled_holder_leaves_no_row_behind(
    store: CheckpointStore, second: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder stalls inside its write while a pruner takes its abandoned run (lease long
    over): the prune waits for the server to end the holder's transaction, then deletes the
    run; the holder, woken, writes nothing, so no checkpoint, blob or task write is left
    without its ledger row (before: the stalled write's blobs and writes were)."""
    ledger = RunLedger(store.database)
    durable = DurableRuns(
        ledger, store.saver, replica_id="replica-p", lease_seconds=0.5, keep_finished=0.5
    )
    ticket = await durable.claim("caller", "order-p", "fp")
    assert isinstance(ticket, Ticket) and ticket.claim is not None
    stalled, go = stall_inside_the_write(store, monkeypatch, after=3)
    run = await run_of(store, ticket.claim)
    await asyncio.wait_for(stalled.wait(), 20)
    await asyncio.sleep(1.1)  # the lease (0.5 s) lapsed, then keep_finished (0.5 s) passed
    pruning = asyncio.create_task(durable.prune())
    await until(lambda: _waiting_or_done(second, 1, pruning))
    assert not pruning.done(), "the prune went on while the holder's write was open"
    assert await asyncio.wait_for(pruning, STATEMENT_TIMEOUT_S + 10) == 1
    go.set()
    with pytest.raises(CheckpointerUnavailable):
        await run
    assert await rows_of(second, ticket.thread_id) == dict.fromkeys((*TABLES, "mur_runs"), 0)


# --------------------------------------------------------------------- a frozen server


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A server of this test's own: freezing the session's would stall other tests."""
    with start() as server:
        try:
            yield server
        finally:
            server.thaw()


async def test_a_frozen_database_gives_503_in_bounded_time_and_stops_the_holder(
    own_server: PostgresServer,
) -> None:
    """PostgreSQL stops answering with its connections open (SIGSTOP, as a partition looks):
    a claim gives up after STATEMENT_TIMEOUT_S (+ psycopg's cancel, at most 10 s) with 503
    `did not answer within 5 s` naming the database without its password, and a run whose
    lease can no longer be renewed is stopped before the lease could lapse (503 too)."""
    url = await asyncio.to_thread(own_server.create_database, "frozen")
    shown = url.replace(PASSWORD, "***")
    lease = 3.0
    async with open_checkpointer(url, schema=SCHEMA) as store:
        durable = DurableRuns(
            RunLedger(store.database),
            store.saver,
            replica_id="replica-f",
            lease_seconds=lease,
            keep_finished=lease,
        )
        claimed_at = time.monotonic()
        ticket = await durable.claim("caller", "order-f", "fp")
        assert isinstance(ticket, Ticket)
        holder = asyncio.create_task(asyncio.Event().wait())  # a long model call
        stopped: list[float] = []
        holder.add_done_callback(lambda _: stopped.append(time.monotonic()))
        durable.watch(ticket, holder)
        durable.start()
        own_server.freeze()
        try:
            with pytest.raises(APIError) as refused:
                await asyncio.wait_for(
                    durable.claim("caller", "order-g", "fp"), STATEMENT_TIMEOUT_S + 15
                )
            await asyncio.wait([holder], timeout=lease)
        finally:
            own_server.thaw()
            await durable.close()
    assert refused.value.status == 503 and refused.value.error.code == "checkpointer_unavailable"
    # The statement timeout gave up (the wait_for above bounds a hang), its words say so.
    assert f"{shown} did not answer within {STATEMENT_TIMEOUT_S:g} s" in refused.value.message
    assert PASSWORD not in refused.value.message
    assert holder.cancelled(), "the holder went on past the lease it could not renew"
    answer = durable.take_lost(ticket)
    assert answer is not None and answer.status == 503
    assert "did not renew this run's lease for 2.5 s" in answer.message
    assert stopped and stopped[0] - claimed_at < lease, "stopped after its lease could lapse"
