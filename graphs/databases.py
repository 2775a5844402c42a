"""SQL over a checkpointer's database, one dialect for SQLite and PostgreSQL (`?` placeholders,
`now` for the database's clock), and the one place a LangGraph saver's writes join the
caller's transaction.

`Database.transaction()` opens a transaction; the statements of the database it yields, and
every write the store's saver makes in the same task meanwhile, commit or roll back together.
The endpoint keeps its claim fence this way (endpoint/durable.py): a checkpoint lands only if
the run's claim holds at the moment it is written, because the check and the write are one
transaction and the claim's row is locked against a takeover until it ends (`row_lock`).

- SQLite: LangGraph's sync saver on the event loop (graphs.checkpointers.InlineSqliteSaver),
  a transaction is `BEGIN IMMEDIATE` (SQLite's one writer) and nothing awaits inside it.
- PostgreSQL: the transaction holds one pooled connection; `JoiningPostgresSaver` runs the
  saver's statements on it. Every call is bounded (`STATEMENT_TIMEOUT_S`, on this side: a
  frozen server cannot enforce its own timeouts), and a session left idle inside a
  transaction (its holder frozen) is ended by the server (`IDLE_IN_TRANSACTION_S`), so a
  stalled holder never keeps its row locked against a takeover for longer than that.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import Any, Literal, Protocol, TypeVar

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

Kind = Literal["sqlite", "postgres"]
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


class CheckpointerError(Exception):
    """A checkpointer target that cannot be used; the message names it without its password."""


class CheckpointerUnavailable(CheckpointerError):
    """The database stopped answering while in use (a restart, a lost network): retry later."""


class Database(Protocol):
    """SQL over the checkpointer's database, in one dialect for SQLite and PostgreSQL."""

    dialect: Kind
    shown: str
    """The database as messages name it (a URL's password as `***`)."""
    now: str
    """An SQL expression: the database's clock, in seconds since the epoch."""
    row_lock: str
    """What a SELECT inside `transaction()` ends with to keep its rows from changing until
    the transaction ends (`FOR SHARE`; empty on SQLite, whose transaction excludes writers)."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (`?` placeholders), committed at once unless inside
        `transaction()`; its rows (SELECT, RETURNING)."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Database]:
        """One transaction: the yielded database's statements and the saver's writes in this
        task commit together on a normal exit and roll back on an exception."""
        ...


class SqliteDatabase:
    """Statements on the inline saver's own connection, on the event loop (a local file)."""

    dialect: Kind = "sqlite"
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    row_lock = ""

    def __init__(self, conn: sqlite3.Connection, shown: str) -> None:
        self.conn, self.shown = conn, shown
        self._in_transaction = False

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            rows = self.conn.execute(sql, tuple(params)).fetchall()
            if not self._in_transaction:
                self.conn.commit()
        except sqlite3.OperationalError as exc:
            raise self._outage(exc) from exc
        return [tuple(row) for row in rows]

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Database]:
        """`BEGIN IMMEDIATE`: the write lock from the first statement; the saver's put
        commits it (its cursor's exit), else it is committed or rolled back here."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise self._outage(exc) from exc
        self._in_transaction = True
        try:
            yield self
        except BaseException:
            self.conn.rollback()
            raise
        else:
            self.conn.commit()
        finally:
            self._in_transaction = False

    def _outage(self, exc: sqlite3.OperationalError) -> Exception:
        if "locked" in str(exc) or "disk" in str(exc):
            return CheckpointerUnavailable(f"the checkpointer {self.shown} is unavailable: {exc}")
        return exc


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
