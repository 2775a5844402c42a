"""The checkpointer factory (persistence/checkpointers.py) and the run ledger, on SQLite and on a
real PostgreSQL server (the `postgres` fixture, tests/postgres.py): targets and their errors,
a checkpointed run resumed through another connection pool (another replica), the ledger's
claims racing across pools, and a bad URL stopping the endpoint with one line that never
holds the password.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import BaseMessage

from asgi_server import running
from fakes import FakeLogprobChat, Scripted
from mur.cli.endpoint import PROG, main
from mur.endpoint import create_app
from mur.graphs import Context, build_graph
from mur.graphs.solve import saved_progress, solve, thread_status
from mur.persistence.checkpointers import (
    CheckpointerError,
    CheckpointStore,
    open_checkpointer,
    parse_target,
)
from mur.persistence.ledger import SCHEMA, RunLedger
from mur.persistence.postgres import SETUP_LOCK
from postgres import PASSWORD, PostgresServer

ROOT = Path(__file__).resolve().parents[2]
NEVER = Context(strategy="critic", gate="never")


def step_of(messages: list[BaseMessage]) -> int:
    found = re.findall(r"Step(\d+):$", str(messages[-1].content))
    return int(found[-1]) if found else 0


def backbone(fail_at: int | None = None) -> FakeLogprobChat:
    """Drafts at steps 1 and 2, the answer at step 3; step `fail_at` raises."""

    def respond(messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        index = step_of(messages)
        if index == fail_at:
            raise RuntimeError(f"scripted failure at step {index}")
        if index >= 3:
            return Scripted(" So the answer is 42.", [-0.2] * 6, stop_reason=None)
        return Scripted(f" draft step {index}", [-0.5] * 4)

    return FakeLogprobChat(responder=respond)


# --------------------------------------------------------------------------- targets


@pytest.mark.parametrize(
    ("text", "kind", "location", "shown"),
    [
        ("runs.sqlite", "sqlite", "runs.sqlite", "runs.sqlite"),
        ("sqlite:///runs.sqlite", "sqlite", "runs.sqlite", "sqlite:///runs.sqlite"),
        ("sqlite:////var/mur/runs.sqlite", "sqlite", "/var/mur/runs.sqlite", None),
        ("sqlite://", "sqlite", ":memory:", None),
        (":memory:", "sqlite", ":memory:", None),
        ("postgresql://mur:pw@db:5432/mur", "postgres", None, "postgresql://mur:***@db:5432/mur"),
        (
            "postgres://mur@db/mur?password=pw",
            "postgres",
            None,
            "postgres://mur@db/mur?password=***",
        ),
    ],
)
def test_a_target_names_its_kind_and_shows_no_password(
    text: str, kind: str, location: str | None, shown: str | None
) -> None:
    target = parse_target(text)
    assert target.kind == kind
    assert target.location == (location or text)
    assert str(target) == (shown or text)
    assert "pw" not in repr(target).replace("postgres", "") or kind == "sqlite"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("mysql://mur:s3cret@db/mur", "unknown kind"),
        ("host=db password=s3cret", "unknown kind"),
        ("postgresql://mur:s3cret@db/mur?nonsense=1", "invalid URI query parameter"),
        ("postgresql://mur:s3cret@[::1/mur", "IPv6"),
    ],
)
def test_a_target_of_no_known_form_is_one_line_without_the_password(text: str, says: str) -> None:
    with pytest.raises(CheckpointerError) as caught:
        parse_target(text)
    message = str(caught.value)
    assert says in message and "s3cret" not in message and "\n" not in message
    assert "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in message


async def test_an_sqlite_file_in_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointerError, match=r"the folder .*missing does not exist"):
        async with open_checkpointer(str(tmp_path / "missing" / "runs.sqlite")):
            pass
    (tmp_path / "not-a-database").write_text("hello, this is no SQLite file\n" * 100)
    with pytest.raises(CheckpointerError, match="cannot use the checkpointer"):
        async with open_checkpointer(str(tmp_path / "not-a-database")):
            pass


# ---------------------------------------------------------------------- PostgreSQL


@pytest.fixture
async def pg_url(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    name = re.sub(r"\W", "_", request.node.name.lower())[:50]
    return await asyncio.to_thread(postgres.create_database, name)


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[CheckpointStore]:
    async with open_checkpointer(pg_url, schema=SCHEMA) as store:
        yield store


async def test_a_run_checkpointed_in_postgres_resumes_through_another_pool(pg_url: str) -> None:
    """Replica A's run stops at step 3; replica B (its own pool, same database) resumes it
    after step 2 and its output is read back; deleting the thread removes it."""
    config: Any = {"configurable": {"thread_id": "round-trip"}}
    async with open_checkpointer(pg_url) as replica_a:
        graph = build_graph(backbone=backbone(fail_at=3), checkpointer=replica_a.saver)
        with pytest.raises(RuntimeError, match="scripted failure"):
            await solve(graph, "What is 6 * 7?", context=NEVER, config=config)
    async with open_checkpointer(pg_url) as replica_b:
        fresh = backbone()
        graph = build_graph(backbone=fresh, checkpointer=replica_b.saver)
        saved = await saved_progress(graph, config)
        assert not saved.new and [s["index"] for s in saved.steps] == [1, 2]
        assert saved.usage["backbone_tokens"] == 8
        solution = await solve(graph, "What is 6 * 7?", context=NEVER, config=config)
        assert solution.resumed and [step_of(c["messages"]) for c in fresh.calls] == [3]
        assert (
            solution.output["answer"] == "42" and solution.output["usage"]["backbone_tokens"] == 14
        )
        assert (await thread_status(graph, config))[0] == "finished"
        await replica_b.saver.adelete_thread("round-trip")
        assert (await thread_status(graph, config))[0] == "new"


async def test_the_ledger_gives_a_run_to_exactly_one_of_two_racing_replicas(
    pg_url: str, pg_store: CheckpointStore
) -> None:
    async with open_checkpointer(pg_url, schema=SCHEMA) as other:
        a, b = RunLedger(pg_store.database), RunLedger(other.database)
        for i in range(20):  # new runs: both INSERT at once
            won = await asyncio.gather(
                a.claim(f"run-{i}", "fp", "replica-a", 0.3),
                b.claim(f"run-{i}", "fp", "replica-b", 0.3),
            )
            assert sorted(w is None for w in won) == [False, True], won
        await asyncio.sleep(0.4)  # every lease expired: both take over at once
        for i in range(20):
            won = await asyncio.gather(
                a.claim(f"run-{i}", "fp", "replica-a", 30),
                b.claim(f"run-{i}", "fp", "replica-b", 30),
            )
            assert sorted(w is None for w in won) == [False, True], won
            assert max(w.number if w else 0 for w in won) == 2
        holders = await pg_store.database.execute(
            "SELECT owner, COUNT(*) FROM mur_runs GROUP BY owner"
        )
        assert sum(count for _, count in holders) == 20
        assert await a.claim("run-0", "another body", "replica-a", 30) is None


async def test_two_replicas_setting_up_a_fresh_database_at_once_both_start(pg_url: str) -> None:
    """One replica sets up (LangGraph's migrations build indexes CONCURRENTLY: each waits for
    every older snapshot in the database) while the other waits for the setup lock. Waiting in
    pg_advisory_lock held a snapshot, so the build waited for the waiter and the waiter for the
    lock: both hung for good (the chaos miniature's replicas never answered /health). The lock
    is held here until both replicas wait for it, so that they meet this way every time."""
    other_sessions = """SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()
        AND pid <> pg_backend_pid() AND query LIKE %s"""

    async def replica() -> list[tuple[Any, ...]]:
        async with open_checkpointer(pg_url, schema=SCHEMA) as store:
            return await store.database.execute("SELECT COUNT(*) FROM mur_runs")

    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as holder:
        await holder.execute("SELECT pg_advisory_lock(%s)", (SETUP_LOCK,))
        replicas = [asyncio.create_task(replica()) for _ in range(2)]
        waiting = 0
        for _ in range(600):  # both asked for the lock (at most 60 s on a busy machine)
            row = await (await holder.execute(other_sessions, ("%advisory_lock%",))).fetchone()
            waiting = row[0] if row else 0
            if waiting == 2 or any(task.done() for task in replicas):
                break
            await asyncio.sleep(0.1)
        await holder.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK,))
        _, hung = await asyncio.wait(replicas, timeout=60)
        if hung:  # end the deadlock, so the test fails instead of hanging
            await holder.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            await asyncio.gather(*hung, return_exceptions=True)
            pytest.fail(f"{len(hung)} of 2 replicas still setting up after 60 s: a deadlock")
        assert [task.result() for task in replicas] == [[(0,)], [(0,)]]
        assert waiting == 2, "the replicas did not both wait for the setup lock"


async def test_the_endpoint_over_postgres_resumes_on_another_replica(pg_url: str) -> None:
    """Two endpoints on one database: a run stopped on replica A is resumed by replica B with
    the same key (only step 3 computed there), and A then answers the key from the ledger."""
    import httpx  # noqa: PLC0415  (only this test speaks HTTP)

    body = {"model": "mur-critic-never", "messages": [{"role": "user", "content": "6 * 7?"}]}
    headers = {"Idempotency-Key": "across-replicas"}
    failing, healthy = backbone(fail_at=3), backbone()
    app_a = create_app(failing, checkpointer=pg_url, replica_id="replica-a")
    app_b = create_app(healthy, checkpointer=pg_url, replica_id="replica-b")
    async with httpx.AsyncClient(timeout=30) as client:
        with running(app_a) as url_a, running(app_b) as url_b:
            stopped = await client.post(f"{url_a}/chat/completions", json=body, headers=headers)
            assert stopped.status_code == 502
            resumed = await client.post(f"{url_b}/chat/completions", json=body, headers=headers)
            assert resumed.json()["mur"]["run"]["outcome"] == "resumed"
            assert [step_of(c["messages"]) for c in healthy.calls] == [3]
            replayed = await client.post(f"{url_a}/chat/completions", json=body, headers=headers)
            assert replayed.json()["id"] == resumed.json()["id"]
            assert replayed.json()["mur"]["run"]["outcome"] == "replayed"
    assert [step_of(c["messages"]) for c in failing.calls] == [1, 2, 3]


@pytest.mark.parametrize("fault", ["wrong password", "no server", "no database"])
def test_a_bad_postgres_url_stops_the_endpoint_with_one_line_without_the_password(
    postgres: PostgresServer,
    fault: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = {
        "wrong password": postgres.url(password="Wr0ng-pw-123"),
        "no server": postgres.url().replace(f":{postgres.port}/", ":9/"),
        "no database": postgres.url(database="nowhere"),
    }[fault]
    says = {
        "wrong password": 'password authentication failed for user "mur"',
        "no server": "Connection refused",
        "no database": 'database "nowhere" does not exist',
    }[fault]
    caplog.set_level(logging.DEBUG)
    assert main(["--checkpointer", url, "--log-level", "debug"]) == 1
    captured = capsys.readouterr()
    line = captured.err.strip()
    assert len(line.splitlines()) == 1 and line.startswith(f"{PROG}: cannot connect")
    assert says in line and "postgresql://mur:***@127.0.0.1:" in line
    everything = captured.out + captured.err + caplog.text
    assert PASSWORD not in everything and "Wr0ng-pw-123" not in everything


def test_the_password_in_the_variable_is_never_printed(postgres: PostgresServer) -> None:
    """`python -m mur endpoint` with MUR_CHECKPOINTER holding a wrong password, at debug level:
    exit 1, one line, no traceback, no password."""
    env = {**os.environ, "MUR_CHECKPOINTER": postgres.url(password="Wr0ng-pw-456")}
    done = subprocess.run(
        [sys.executable, "-m", "mur", "endpoint", "--log-level", "debug"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr and "mur:***@" in done.stderr
    assert "Wr0ng-pw-456" not in done.stderr and PASSWORD not in done.stderr
