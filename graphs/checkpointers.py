"""The one place a checkpointer is opened from a target string, for every command that
checkpoints graph runs:

- a file path, `sqlite:///relative/path` or `sqlite:////absolute/path` (SQLAlchemy's form), or
  `:memory:`: an embedded SQLite database (one process; nothing to install);
- `postgresql://USER:PASSWORD@HOST:PORT/DATABASE`: PostgreSQL through a connection pool, so
  several processes (endpoint replicas) share the runs and any of them can resume a thread.

`open_checkpointer(target)` is an async context manager yielding a `CheckpointStore`: the
LangGraph saver, and a `Database` over the same database for the caller's own tables (the
endpoint's run ledger), with one SQL dialect (`?` placeholders, `database.now` for the
database's clock, so replicas share one clock). A target that cannot be used raises one
`CheckpointerError` naming it, the password replaced by `***`; no message here ever holds it.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

import aiosqlite
import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

MEMORY = ":memory:"
FORMS = "a file path, sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
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
Kind = Literal["sqlite", "postgres"]
Pool = AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]


class InlineSqliteSaver(SqliteSaver):
    """LangGraph's SQLite saver, its async methods run inline on the event loop.

    LangGraph's AsyncSqliteSaver sends every statement to aiosqlite's thread and waits for it:
    a run writes a checkpoint and its task writes after each node, about nine round trips a
    model request, and the hops (not SQLite) cost more client CPU than everything else the
    graph does once the server answers as fast as a GPU (`mur bench client`). A write to a
    local file takes well under a millisecond, so it is done right here. For local files
    only: a database across a network belongs to a saver that does not hold the loop.
    """

    @classmethod
    @contextmanager
    def open(cls, path: Path, busy_timeout_s: float) -> Iterator[InlineSqliteSaver]:
        """The saver of the file at `path`, set up (WAL mode, its tables). WAL with
        `synchronous=NORMAL` commits without an fsync: a crash of the process loses nothing,
        a power cut at most the last writes (a question then resumes a node earlier)."""
        conn = sqlite3.connect(path, timeout=busy_timeout_s, check_same_thread=False)
        try:
            saver = cls(conn)
            saver.setup()
            conn.execute("PRAGMA synchronous=NORMAL")
            yield saver
        finally:
            conn.close()

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for item in self.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, Any]:
        return self.get_delta_channel_history(config=config, channels=channels)


class CheckpointerError(Exception):
    """A checkpointer target that cannot be used; the message names it without its password."""


class CheckpointerUnavailable(CheckpointerError):
    """The database stopped answering while in use (a restart, a lost network): retry later."""


@dataclass(frozen=True)
class CheckpointTarget:
    """A parsed target: `location` is what the driver needs (it may hold a password: never
    print it), `shown` what messages print."""

    kind: Kind
    location: str = field(repr=False)
    shown: str

    def __str__(self) -> str:
        return self.shown


def _secrets(url: str) -> set[str]:
    """The passwords `url` holds (its user part's, `password=` parameters), as written and
    decoded; found without a URL parser, which a malformed URL would stop."""
    found = re.findall(r"(?i)[?&]password=([^&#]*)", url)
    userinfo = re.match(r"^[A-Za-z][\w+.-]*://([^/?#]*)@", url)
    if userinfo and ":" in userinfo.group(1):
        found.append(userinfo.group(1).partition(":")[2])
    return {s for s in found + [unquote(s) for s in found] if s}


def redact(url: str) -> str:
    """`url` with the password of its user part and any `password=` parameter as `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return scrub(url, url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}{':***' if colon else ''}@{hostport}"
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def scrub(text: str, url: str) -> str:
    """`text` on one line, every password of `url` in it replaced by `***` (drivers quote
    the URL in some errors)."""
    line = " ".join(text.split())
    for secret in sorted(_secrets(url), key=len, reverse=True):
        line = line.replace(secret, "***")
    return line


def parse_target(text: str) -> CheckpointTarget:
    """The target `text` names; CheckpointerError for one of no known form."""
    raw = text.strip()
    scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
    shown = redact(raw) if scheme not in ("", "sqlite") else raw
    if not raw:
        raise CheckpointerError(f"the checkpointer target is empty: give {FORMS}")
    if scheme in ("postgresql", "postgres"):
        try:
            conninfo_to_dict(raw)
        except psycopg.Error as exc:
            raise CheckpointerError(
                f"cannot read the checkpointer URL {shown}: {scrub(str(exc), raw)}; write it "
                "as postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
            ) from None
        return CheckpointTarget("postgres", raw, shown)
    if scheme == "sqlite":
        rest = raw[len("sqlite://") :]
        if rest in ("", "/", f"/{MEMORY}"):
            return CheckpointTarget("sqlite", MEMORY, shown)
        if rest.startswith("/"):
            return CheckpointTarget("sqlite", rest[1:], shown)
    if scheme or re.match(r"^\w+\s*=", raw):  # another scheme, or libpq's key=value pairs
        what = shown if scheme else "key=value pairs"
        raise CheckpointerError(f"unknown kind of checkpointer target {what!r}: give {FORMS}")
    return CheckpointTarget("sqlite", raw, raw)


class Database(Protocol):
    """SQL over the checkpointer's database, in one dialect for SQLite and PostgreSQL."""

    dialect: Kind
    now: str
    """An SQL expression: the database's clock, in seconds since the epoch."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (`?` placeholders), committed at once; its rows (RETURNING)."""
        ...


@dataclass(frozen=True)
class CheckpointStore:
    """What `open_checkpointer` yields: the saver, and SQL over the same database."""

    saver: BaseCheckpointSaver[str]
    database: Database
    target: CheckpointTarget

    def is_outage(self, exc: BaseException) -> bool:
        """Whether `exc` says the database stopped answering (not a fault of the run)."""
        return isinstance(exc, CheckpointerUnavailable | psycopg.OperationalError | PoolTimeout)


class SqliteDatabase:
    """Statements on the saver's own connection, under its lock (one writer at a time)."""

    dialect: Kind = "sqlite"
    now = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, saver: AsyncSqliteSaver, target: CheckpointTarget) -> None:
        self.saver, self.target = saver, target

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self.saver.lock:
            try:
                async with self.saver.conn.execute(sql, tuple(params)) as cursor:
                    rows = await cursor.fetchall()
                await self.saver.conn.commit()
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) or "disk" in str(exc):
                    raise CheckpointerUnavailable(
                        f"the checkpointer {self.target} is unavailable: {exc}"
                    ) from exc
                raise
        return [tuple(row) for row in rows]


class PostgresDatabase:
    """Statements on connections of the saver's pool (autocommit: each one atomic)."""

    dialect: Kind = "postgres"
    now = "extract(epoch from now())::float8"

    def __init__(self, pool: Pool, target: CheckpointTarget) -> None:
        self.pool, self.target = pool, target

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        query = sql.replace("%", "%%").replace("?", "%s")
        try:
            async with (
                self.pool.connection() as conn,
                conn.cursor(row_factory=tuple_row) as cursor,
            ):
                await cursor.execute(query, tuple(params))
                return await cursor.fetchall() if cursor.description else []
        except (psycopg.OperationalError, PoolTimeout) as exc:
            detail = scrub(str(exc), self.target.location)
            raise CheckpointerUnavailable(
                f"the checkpointer database {self.target} is unavailable: {detail}"
            ) from None


@asynccontextmanager
async def open_checkpointer(
    target: str | CheckpointTarget,
    *,
    schema: Sequence[str] = (),
    pool_size: int = 10,
    connect_timeout: float = 10.0,
) -> AsyncIterator[CheckpointStore]:
    """Open the checkpointer `target` names, its tables set up (and the caller's `schema`
    statements run, under the same lock on PostgreSQL); closed on exit.

    Raises CheckpointerError, naming the target and what to do, when it cannot be opened.
    """
    chosen = target if isinstance(target, CheckpointTarget) else parse_target(target)
    if chosen.kind == "postgres":
        async with _postgres(chosen, schema, pool_size, connect_timeout) as store:
            yield store
    else:
        async with _sqlite(chosen, schema) as store:
            yield store


def check_folder(target: CheckpointTarget) -> None:
    """CheckpointerError when an SQLite file's folder is missing (SQLite would say only
    "unable to open database file"); a Postgres target is checked when it is opened."""
    if target.kind != "sqlite" or target.location == MEMORY:
        return
    folder = Path(target.location).expanduser().parent
    if not folder.is_dir():
        raise CheckpointerError(
            f"cannot open the checkpointer {target}: the folder {folder} does not exist; "
            "create it or choose another file"
        )


@asynccontextmanager
async def _sqlite(
    target: CheckpointTarget, schema: Sequence[str]
) -> AsyncIterator[CheckpointStore]:
    path = target.location
    check_folder(target)
    try:
        conn = await aiosqlite.connect(path if path == MEMORY else str(Path(path).expanduser()))
    except sqlite3.Error as exc:
        raise CheckpointerError(f"cannot open the checkpointer {target}: {exc}") from None
    try:
        saver = AsyncSqliteSaver(conn)
        database = SqliteDatabase(saver, target)
        try:
            await saver.setup()
            for statement in schema:
                await database.execute(statement)
        except sqlite3.Error as exc:
            raise CheckpointerError(
                f"cannot use the checkpointer {target}: {exc}; give an SQLite file this "
                "process may write, or a new path"
            ) from None
        yield CheckpointStore(saver, database, target)
    finally:
        await conn.close()


@asynccontextmanager
async def _postgres(
    target: CheckpointTarget, schema: Sequence[str], pool_size: int, connect_timeout: float
) -> AsyncIterator[CheckpointStore]:
    await _probe(target, connect_timeout)
    pool: Pool = AsyncConnectionPool(
        target.location,
        connection_class=psycopg.AsyncConnection[DictRow],
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        min_size=1,
        max_size=max(2, pool_size),  # setup holds one connection for its lock, uses another
        timeout=POOL_WAIT_S,
        open=False,
        check=AsyncConnectionPool.check_connection,  # a restarted server's dead connections
        name="mur-checkpointer",
    )
    try:
        saver = AsyncPostgresSaver(pool)
        database = PostgresDatabase(pool, target)
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
        yield CheckpointStore(saver, database, target)
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
