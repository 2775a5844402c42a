"""PostgreSQL as a checkpointer (the `serve` extra): a pool shared by LangGraph's saver and
the endpoint's own tables, every call bounded, and the saver's writes joining the transaction
the caller opened (`Database.transaction()`, persistence.databases), so that the endpoint's
fence checks its claim and writes the checkpoint in one transaction.

Every call is bounded (`STATEMENT_TIMEOUT_S`, on this side: a frozen server cannot enforce its
own timeouts), and a session left idle inside a transaction (its holder frozen) is ended by the
server (`IDLE_IN_TRANSACTION_S`), so a stalled holder never keeps its row locked against a
takeover for longer than that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any, TypeVar

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mur.persistence.checkpointers import CheckpointStore, CheckpointTarget, scrub
from mur.persistence.databases import CheckpointerError, CheckpointerUnavailable, Database, Kind

Pool = AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]
T = TypeVar("T")

STATEMENT_TIMEOUT_S = 5.0
"""How long one statement, or one transaction of the endpoint's fence, may take before the
database counts as unavailable (CheckpointerUnavailable, the endpoint's 503). psycopg then
cancels the query, and closes the connection if the server does not answer the cancel
within its own 5 + 5 s: a call returns within STATEMENT_TIMEOUT_S + 10 s however the server
behaves."""
IDLE_IN_TRANSACTION_S = 3.0
"""PostgreSQL ends a session idle this long inside a transaction (its holder frozen between
the fence's check and its write): the transaction rolls back and its row lock goes, so a
takeover waits at most this long, within STATEMENT_TIMEOUT_S."""
SETUP_LOCK = 0x6D75725F7365  # advisory lock key: replicas starting at once set up in turn
SETUP_LOCK_POLL_S = 0.1
"""How often a replica asks again for the setup lock another one holds. It asks
(pg_try_advisory_lock) instead of waiting in pg_advisory_lock: a session waiting in a
statement holds a snapshot, and the holder's setup runs LangGraph's migrations, among them
CREATE INDEX CONCURRENTLY, which waits until every older snapshot in the database is gone.
The build (on one connection of the holder's pool) then waited for the waiting replica's
snapshot, that replica for the lock, and the lock (held on another connection of that pool)
for the build to end: a deadlock PostgreSQL cannot see (nothing tells it that two sessions
are one process). Both replicas hung at start (the chaos benchmark, BENCHMARKS.md)."""
POOL_WAIT_S = 5.0
"""How long a statement waits for a pooled connection before the database counts as down
(PoolTimeout: the endpoint's 503 naming it). LangGraph's Postgres saver writes under one lock,
so the writes queued behind a stopped server fail one after another: with psycopg's default
of 30 s each, a run went on waiting for minutes after PostgreSQL had stopped."""
SESSION_SETTINGS = {
    "options": f"-c idle_in_transaction_session_timeout={int(IDLE_IN_TRANSACTION_S * 1000)}",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
"""Every pooled session's: the server ends one left idle in a transaction (above), and
TCP keepalives find a server gone from the network (a frozen one still answers them: the
statement bound, STATEMENT_TIMEOUT_S, covers that)."""


def check_url(raw: str, shown: str) -> None:
    """CheckpointerError for a PostgreSQL URL libpq cannot read (`shown`: without password)."""
    try:
        conninfo_to_dict(raw)
    except psycopg.Error as exc:
        raise CheckpointerError(
            f"cannot read the checkpointer URL {shown}: {scrub(str(exc), raw)}; write it "
            "as postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        ) from None


_JOINED: ContextVar[tuple[Pool, psycopg.AsyncConnection[DictRow]] | None] = ContextVar(
    "mur_joined_transaction", default=None
)
"""The pool and connection of the transaction open in this task (PostgresDatabase)."""


class PostgresDatabase:
    """Statements on connections of the saver's pool (autocommit: each one atomic)."""

    dialect: Kind = "postgres"
    now = "extract(epoch from now())::float8"
    row_lock = " FOR SHARE"

    def __init__(
        self,
        pool: Pool,
        shown: str,
        clean: Callable[[str], str],
        conn: psycopg.AsyncConnection[DictRow] | None = None,
    ) -> None:
        """`shown`: the target as messages name it; `clean`: a driver's message without the
        password (drivers quote the URL in some errors)."""
        self.pool, self.shown, self.clean, self.conn = pool, shown, clean, conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        query = sql.replace("%", "%%").replace("?", "%s")
        if self.conn is not None:  # inside transaction(): bounded as a whole there
            return await _rows(self.conn, query, params)

        async def run() -> list[tuple[Any, ...]]:
            async with self.pool.connection() as conn:
                return await _rows(conn, query, params)

        return await bounded(run(), self.shown, self.clean)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Database]:
        try:
            async with (
                asyncio.timeout(STATEMENT_TIMEOUT_S),
                self.pool.connection() as conn,
                conn.transaction(),
            ):
                token = _JOINED.set((self.pool, conn))
                try:
                    yield PostgresDatabase(self.pool, self.shown, self.clean, conn)
                finally:
                    _JOINED.reset(token)
        except TimeoutError:
            raise no_answer(self.shown) from None
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise unavailable(self.shown, self.clean(str(exc))) from None


async def _rows(
    conn: psycopg.AsyncConnection[DictRow], query: str, params: Sequence[Any]
) -> list[tuple[Any, ...]]:
    async with conn.cursor(row_factory=tuple_row) as cursor:
        await cursor.execute(query, tuple(params))
        return await cursor.fetchall() if cursor.description else []


def no_answer(shown: str) -> CheckpointerUnavailable:
    return CheckpointerUnavailable(
        f"the checkpointer database {shown} did not answer within {STATEMENT_TIMEOUT_S:g} s"
    )


def unavailable(shown: str, detail: str) -> CheckpointerUnavailable:
    return CheckpointerUnavailable(f"the checkpointer database {shown} is unavailable: {detail}")


async def bounded(call: Awaitable[T], shown: str, clean: Callable[[str], str]) -> T:
    """`call`, given up after STATEMENT_TIMEOUT_S; a timeout or a lost connection is
    CheckpointerUnavailable naming the database. The call is left to psycopg's cancellation
    in the background (which waits up to 10 s more for a frozen server): the caller is not."""
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=STATEMENT_TIMEOUT_S)
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise no_answer(shown)
    try:
        return task.result()
    except (psycopg.OperationalError, PoolTimeout) as exc:
        raise unavailable(shown, clean(str(exc))) from None


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read an abandoned call's outcome, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class JoiningPostgresSaver(AsyncPostgresSaver):
    """LangGraph's Postgres saver whose statements join the transaction PostgresDatabase
    opened in this task (on its pool), and whose calls outside one are bounded."""

    def __init__(self, pool: Pool, shown: str, clean: Callable[[str], str]) -> None:
        super().__init__(pool)
        self.shown, self.clean = shown, clean

    async def _bounded(self, call: Awaitable[T]) -> T:
        return await bounded(call, self.shown, self.clean)

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[Any]:
        conn = self._joined()
        if conn is not None:
            async with conn.cursor(binary=True, row_factory=dict_row) as cursor:
                yield cursor
            return
        async with super()._cursor(pipeline=pipeline) as cursor:
            yield cursor

    def _joined(self) -> psycopg.AsyncConnection[DictRow] | None:
        """The connection of the transaction open in this task on this saver's pool, if any."""
        joined = _JOINED.get()
        return joined[1] if joined is not None and joined[0] is self.conn else None

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._bounded(super().aget_tuple(config))

    async def aput(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        if self._joined() is not None:
            return await super().aput(*args, **kwargs)
        return await self._bounded(super().aput(*args, **kwargs))

    async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
        if self._joined() is not None:
            return await super().aput_writes(*args, **kwargs)
        return await self._bounded(super().aput_writes(*args, **kwargs))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._bounded(super().adelete_thread(thread_id))

    async def alist(self, *args: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        found = super().alist(*args, **kwargs)
        while True:
            try:
                item = await self._bounded(anext(found))
            except StopAsyncIteration:
                return
            yield item


@asynccontextmanager
async def open_postgres(
    target: CheckpointTarget, schema: Sequence[str], pool_size: int, connect_timeout: float
) -> AsyncIterator[CheckpointStore]:
    await _probe(target, connect_timeout)
    pool: Pool = AsyncConnectionPool(
        target.location,
        connection_class=psycopg.AsyncConnection[DictRow],
        kwargs={
            "autocommit": True,
            "prepare_threshold": 0,
            "row_factory": dict_row,
            **SESSION_SETTINGS,
        },
        min_size=1,
        max_size=max(2, pool_size),  # setup holds one connection for its lock, uses another
        timeout=POOL_WAIT_S,
        open=False,
        check=AsyncConnectionPool.check_connection,  # a restarted server's dead connections
        name="mur-checkpointer",
    )
    try:
        clean = partial(scrub, url=target.location)
        saver = JoiningPostgresSaver(pool, target.shown, clean)
        database = PostgresDatabase(pool, target.shown, clean)
        try:
            await pool.open(wait=True, timeout=connect_timeout)
            async with pool.connection() as conn:
                await _take_setup_lock(conn)
                try:
                    await saver.setup()
                    for statement in schema:
                        await database.execute(statement)
                finally:
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK,))
        except (psycopg.Error, PoolTimeout) as exc:
            raise CheckpointerError(
                f"cannot set up the checkpointer database {target}: "
                f"{scrub(str(exc), target.location)}; the user needs the right to create "
                "tables in that database"
            ) from None
        outages = (CheckpointerUnavailable, psycopg.OperationalError, PoolTimeout)
        yield CheckpointStore(saver, database, target, outages)
    finally:
        await pool.close()


async def _take_setup_lock(conn: psycopg.AsyncConnection[DictRow]) -> None:
    """The setup lock for this session, once no other holds it; between two asks the session
    is idle, holding no snapshot a concurrent index build would wait for (SETUP_LOCK_POLL_S)."""
    while True:
        cursor = await conn.execute("SELECT pg_try_advisory_lock(%s) AS taken", (SETUP_LOCK,))
        row = await cursor.fetchone()
        if row is not None and row["taken"]:
            return
        await asyncio.sleep(SETUP_LOCK_POLL_S)


async def _probe(target: CheckpointTarget, timeout: float) -> None:
    """One connection first, so that a refused or unauthorised one is named precisely (a
    pool would only time out)."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            target.location, connect_timeout=max(1, round(timeout))
        )
    except psycopg.Error as exc:
        raise CheckpointerError(
            f"cannot connect to the checkpointer database {target}: "
            f"{scrub(str(exc), target.location)}; check the URL, that PostgreSQL runs there "
            "and accepts this user and password"
        ) from None
    await conn.close()
