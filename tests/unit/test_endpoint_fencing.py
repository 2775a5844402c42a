"""The claim fence (persistence/ledger.py, persistence/fence.py), on SQLite and on a real
PostgreSQL (the `postgres` fixture): a claim whose run was claimed over, by another replica or
by a retry that reached its own, can neither renew, finish nor stop the run; its watch is its
own, so it never pops the new claim's; its run is cancelled, or stops at its next checkpoint,
which is refused; and pruning never deletes a run under a holder that may still write to it.
`--keep-finished` is at least the lease. The races inside a write (a takeover or a prune while
it is open) are staged on PostgreSQL in test_endpoint_fence_staged.py.

A step held in the scripted fake stands for a long model call, during which the lease lapses
(its renewals fail, or none come: the renewal loop is not started here) and the run is
claimed over.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_endpoint_runs import Backbone

from mur.cli.endpoint import PROG, main
from mur.endpoint import create_app
from mur.endpoint.durable import DurableRuns, Ticket
from mur.endpoint.errors import APIError
from mur.graphs import Context, build_graph
from mur.graphs.solve import solve
from mur.persistence.checkpointers import CheckpointStore, open_checkpointer
from mur.persistence.fence import FencedSaver
from mur.persistence.ledger import SCHEMA, TABLE, Claim, ClaimLost, RunLedger

NEVER = Context(strategy="critic", gate="never")
QUESTION = "What is 6 * 7?"


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CheckpointStore]:
    """A checkpointer with the run ledger: an SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        target = str(tmp_path / "runs.sqlite")
    else:
        postgres = request.getfixturevalue("postgres")
        name = f"fence_{uuid.uuid4().hex[:16]}"
        target = await asyncio.to_thread(postgres.create_database, name)
    async with open_checkpointer(target, schema=SCHEMA) as opened:
        yield opened


def config_of(claim: Claim) -> Any:
    return Ticket(claim.thread_id, "k", "cid", 0, claim).config()


async def written_by(store: CheckpointStore, thread_id: str) -> list[int]:
    """The claim that wrote each checkpoint of the thread (its metadata's `mur_claim`)."""
    found = await store.database.execute(
        "SELECT metadata FROM checkpoints WHERE thread_id = ? ORDER BY checkpoint_id",
        (thread_id,),
    )
    parsed = [m if isinstance(m, dict) else json.loads(m) for (m,) in found]  # PG: jsonb
    return [metadata["mur_claim"] for metadata in parsed]


async def holds(ledger: RunLedger, claim: Claim) -> bool:
    """Whether `claim` still holds its run (the fence a write passes)."""
    try:
        async with ledger.fenced(claim):
            return True
    except ClaimLost:
        return False


async def lapse(store: CheckpointStore, thread_id: str) -> None:
    """End the run's lease now, as a whole lease without renewal would."""
    await store.database.execute(
        "UPDATE mur_runs SET lease_expires = 0 WHERE thread_id = ?", (thread_id,)
    )


async def run_until_held(
    store: CheckpointStore, backbone: Backbone, claim: Claim
) -> asyncio.Task[Any]:
    """The graph run of `claim`, checkpointed through the fence, once it waits in its held
    step."""
    graph = build_graph(
        backbone=backbone.fake, checkpointer=FencedSaver(store.saver, RunLedger(store.database))
    )
    run = asyncio.create_task(
        solve(graph, QUESTION, context=NEVER, config=config_of(claim), durability="sync")
    )
    assert await asyncio.to_thread(backbone.held.wait, 10), "the run never reached its held step"
    return run


# ------------------------------------------------------------------------ the ledger


async def test_a_claim_taken_over_can_neither_renew_finish_nor_stop(
    store: CheckpointStore,
) -> None:
    """A replica's claim lapses and the same replica claims the run again (a retry reached
    it): only the new claim renews; the old one finishes and stops nothing. A row pruned and
    claimed anew counts from 1 again, and still the old claim 1 holds nothing."""
    ledger = RunLedger(store.database)
    old = await ledger.claim("run-1", "fp", "replica-a", 30)
    assert old is not None and old.number == 1
    await lapse(store, "run-1")
    new = await ledger.claim("run-1", "fp", "replica-a", 30)
    assert new is not None and new.number == 2 and new.owner == old.owner
    assert await ledger.renew(30, [old, new]) == {new}
    assert not await holds(ledger, old) and await holds(ledger, new)
    assert not await ledger.finish(old, {"cid": "stale"})
    assert not await ledger.stop(old, "failed: stale")
    entry = await ledger.entry("run-1")
    assert entry is not None and (entry.status, entry.claims, entry.reply) == ("running", 2, None)

    await ledger.delete("run-1")  # pruned, then the key comes back
    await asyncio.sleep(0.01)  # a later creation time than the first row's
    again = await ledger.claim("run-1", "fp", "replica-a", 30)
    assert again is not None and again.number == old.number and again.owner == old.owner
    assert not await holds(ledger, old) and await ledger.renew(30, [old]) == set()
    assert await holds(ledger, again) and await ledger.finish(again, {"cid": "new"})


async def test_a_ledger_of_an_older_version_takes_claims_once_the_endpoint_opens_it(
    store: CheckpointStore,
) -> None:
    """Older versions' ledger had a `keyed` column, NOT NULL without a default: a claim that
    does not write it would be refused. Opening the run service drops it; its rows stay."""
    await store.database.execute(f"DROP TABLE {TABLE}")
    old_table = SCHEMA[0].replace(
        "fingerprint TEXT NOT NULL,", "fingerprint TEXT NOT NULL, keyed INTEGER NOT NULL,"
    )
    for statement in (old_table, *SCHEMA[1:]):
        await store.database.execute(statement)
    await store.database.execute(
        f"""INSERT INTO {TABLE} (thread_id, fingerprint, keyed, status, owner, lease_expires,
            claims, reply, created_at, updated_at)
            VALUES ('old-run', 'fp', 1, 'finished', 'replica-old', 0, 1, '{{}}', 0, 0)"""
    )
    service = create_app(Backbone().fake).state.service
    await service.open(store)
    try:
        ticket = await service.durable.claim("caller", "order-1", "fp")
        assert isinstance(ticket, Ticket) and ticket.claim is not None
        assert ticket.claim.number == 1
        old = await service.durable.ledger.entry("old-run")
        assert old is not None and (old.status, old.reply) == ("finished", {})
    finally:
        await service.close()


# ------------------------------------------------------------- one replica, two claims


async def test_a_replica_claiming_its_lapsed_run_again_stops_the_old_run_alone(
    store: CheckpointStore,
) -> None:
    """The issue's reproduction: renewals fail for a whole lease during a long call and the
    client's retry reaches the same replica. The new claim cancels the old run at once; the
    old run, failing as it ends, neither frees the row nor stops the new claim's renewals
    (each claim has its watch), so no other replica can take the run while it executes."""
    ledger = RunLedger(store.database)
    durable = DurableRuns(
        ledger, store.saver, replica_id="replica-a", lease_seconds=1.0, keep_finished=1.0
    )
    forever = asyncio.Event()
    old = await durable.claim("caller", "order-7", "fp")
    assert isinstance(old, Ticket)
    old_task = asyncio.create_task(forever.wait())
    durable.watch(old, old_task)
    await asyncio.sleep(1.1)  # no renewal for a whole lease

    new = await durable.claim("caller", "order-7", "fp")
    assert isinstance(new, Ticket) and new.claim.number == 2
    new_task = asyncio.create_task(forever.wait())
    durable.watch(new, new_task)
    await asyncio.wait([old_task], timeout=1)
    assert old_task.cancelled() and durable.take_lost(old), "the old run was not stopped"
    assert not durable.take_lost(new) and not new_task.done()

    await durable.stopped(old, "failed: the backbone timed out")  # the old run ends, failing
    entry = await ledger.entry(new.thread_id)
    assert entry is not None and (entry.status, entry.owner, entry.claims) == (
        "running",
        "replica-a",
        2,
    ), "the old run freed the new claim's row"
    with pytest.raises(APIError) as refused:
        await durable.finished(old, {"answer": "stale"})
    assert refused.value.status == 409 and refused.value.error.code == "run_taken_over"

    for _ in range(3):  # 1.2 s after the new claim: only renewals keep its lease
        await asyncio.sleep(0.4)
        await durable.renew()
    entry = await ledger.entry(new.thread_id)
    assert entry is not None and entry.lease_left > 0, "the new claim was not renewed"
    assert not new_task.done()
    assert await ledger.claim(new.thread_id, "fp", "replica-b", 30) is None
    await durable.finished(new, {"answer": "42"})
    entry = await ledger.entry(new.thread_id)
    assert entry is not None and entry.status == "finished"
    assert entry.reply is not None and entry.reply["trace"] == {"answer": "42"}
    new_task.cancel()


async def test_a_run_cancelled_before_it_started_is_not_renewed(store: CheckpointStore) -> None:
    """A client that leaves at once cancels its run's task before its first step, so none of
    the run's handlers frees the claim: its lease must then expire, not be renewed for good
    (409 for every retry of the key while this replica lives)."""
    ledger = RunLedger(store.database)
    durable = DurableRuns(
        ledger, store.saver, replica_id="replica-a", lease_seconds=1.0, keep_finished=1.0
    )
    ticket = await durable.claim("caller", "order-8", "fp")
    assert isinstance(ticket, Ticket)
    never_started = asyncio.create_task(asyncio.Event().wait())
    never_started.cancel()
    durable.watch(ticket, never_started)
    await asyncio.wait([never_started])
    for _ in range(3):
        await asyncio.sleep(0.4)
        await durable.renew()
    entry = await ledger.entry(ticket.thread_id)
    assert entry is not None and entry.lease_left < 0, "a run that never started kept its lease"
    again = await durable.claim("caller", "order-8", "fp")
    assert isinstance(again, Ticket) and again.claim.number == 2


# ------------------------------------------------------------------------ checkpoints


async def test_a_claimed_over_run_stops_at_its_next_checkpoint(store: CheckpointStore) -> None:
    """The run is claimed over (by its own replica: only the claim number differs) during its
    step-2 call, and no renewal tells it. When the call returns its checkpoint is refused:
    it stops before asking step 3 and writes nothing more; the new claim resumes after step 1."""
    ledger = RunLedger(store.database)
    first = await ledger.claim("run-2", "fp", "replica-a", 30)
    assert first is not None
    stalled = Backbone(hold_at=2)
    run = await run_until_held(store, stalled, first)
    await lapse(store, "run-2")
    second = await ledger.claim("run-2", "fp", "replica-a", 30)
    assert second is not None
    before = await written_by(store, "run-2")
    stalled.release.set()
    with pytest.raises(ClaimLost, match="claim 1 of replica-a no longer holds it"):
        await run
    assert stalled.asked() == [1, 2], "the claimed-over run asked the next step"
    assert await written_by(store, "run-2") == before == [1] * len(before)

    resumed = Backbone()
    graph = build_graph(backbone=resumed.fake, checkpointer=FencedSaver(store.saver, ledger))
    solution = await solve(
        graph, QUESTION, context=NEVER, config=config_of(second), durability="sync"
    )
    assert solution.resumed and solution.output["answer"] == "42"
    assert resumed.asked() == [2, 3]
    assert set(await written_by(store, "run-2")) == {1, 2}


# ------------------------------------------------------------------------------ pruning


async def test_pruning_a_lapsed_run_leaves_nothing_its_live_holder_writes_after(
    store: CheckpointStore,
) -> None:
    """A run whose lease lapsed `keep_finished` ago is pruned (its replica looks dead), but
    its holder was only stalled in a call: the checkpoint it writes when the call returns is
    refused, so the pruned run leaves no checkpoint behind and nothing more is asked."""
    ledger = RunLedger(store.database)
    durable = DurableRuns(
        ledger, store.saver, replica_id="replica-a", lease_seconds=0.5, keep_finished=0.5
    )
    ticket = await durable.claim("caller", "order-9", "fp")
    assert isinstance(ticket, Ticket)
    stalled = Backbone(hold_at=2)
    run = await run_until_held(store, stalled, ticket.claim)
    await asyncio.sleep(1.1)  # the lease (0.5 s) lapsed, then keep_finished (0.5 s) passed
    assert await durable.prune() == 1
    stalled.release.set()
    with pytest.raises(ClaimLost):
        await run
    assert await written_by(store, ticket.thread_id) == [], "the holder wrote after the prune"
    assert await ledger.entry(ticket.thread_id) is None
    assert stalled.asked() == [1, 2]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--keep-finished", "0"], "--keep-finished 0 is shorter than --lease-seconds 30"),
        (
            ["--lease-seconds", "60", "--keep-finished", "59.5"],
            "--keep-finished 59.5 is shorter than --lease-seconds 60",
        ),
    ],
    ids=["zero", "below the lease"],
)
def test_keep_finished_shorter_than_the_lease_is_refused_with_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything starts (the checkpointer here could not even open)."""
    assert main([*argv, "--checkpointer", "mysql://nowhere/mur"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"{PROG}: error: {says}")
    assert "give --keep-finished" in err
    assert main(["--keep-finished", "30", "--checkpointer", "mysql://nowhere/mur"]) == 1
    assert "unknown kind of checkpointer" in capsys.readouterr().err  # the lease itself is fine


def test_an_app_keeping_runs_shorter_than_the_lease_is_refused() -> None:
    """When it is made, not once it serves (the run service checks it)."""
    backbone = Backbone().fake
    with pytest.raises(ValueError, match=r"keep_finished at least lease_seconds, got 30\.0 and 0$"):
        create_app(backbone, lease_seconds=30.0, keep_finished=0)
    with pytest.raises(ValueError, match=r"got 2 and 1\.5$"):
        create_app(backbone, lease_seconds=2, keep_finished=1.5)
    assert create_app(backbone, lease_seconds=2, keep_finished=2) is not None
