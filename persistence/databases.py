"""SQL over a checkpointer's database, one dialect for SQLite and PostgreSQL (`?` placeholders,
`now` for the database's clock), and the one place a LangGraph saver's writes join the
caller's transaction.

`Database.transaction()` opens a transaction; the statements of the database it yields, and
every write the store's saver makes in the same task meanwhile, commit or roll back together.
The endpoint keeps its claim fence this way (endpoint/durable.py): a checkpoint lands only if
the run's claim holds at the moment it is written, because the check and the write are one
transaction and the claim's row is locked against a takeover until it ends (`row_lock`).

- SQLite: LangGraph's sync saver on the event loop (persistence.checkpointers.InlineSqliteSaver),
  a transaction is `BEGIN IMMEDIATE` (SQLite's one writer) and nothing awaits inside it.
- PostgreSQL (persistence.postgres, the `serve` extra): the transaction holds one pooled
  connection, on which `JoiningPostgresSaver` runs the saver's statements, every call bounded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal, Protocol

Kind = Literal["sqlite", "postgres"]


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
