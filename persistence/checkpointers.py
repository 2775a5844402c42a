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

import re
import sqlite3
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.sqlite import SqliteSaver

from mur.nodes.extras import require
from mur.persistence.databases import CheckpointerError as CheckpointerError
from mur.persistence.databases import CheckpointerUnavailable as CheckpointerUnavailable
from mur.persistence.databases import Database as Database
from mur.persistence.databases import Kind, SqliteDatabase

MEMORY = ":memory:"
FORMS = "a file path, sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
SQLITE_BUSY_TIMEOUT_S = 5.0
"""How long an SQLite statement waits for another process's write lock before the file counts
as unavailable (a second process writing the same file: `mur endpoint` is one replica)."""


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
    def open(cls, path: Path | str, busy_timeout_s: float) -> Iterator[InlineSqliteSaver]:
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
        require("serve", "a PostgreSQL checkpointer")
        from mur.persistence.postgres import check_url  # noqa: PLC0415 (the serve extra)

        check_url(raw, shown)
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


@dataclass(frozen=True)
class CheckpointStore:
    """What `open_checkpointer` yields: the saver, and SQL over the same database."""

    saver: BaseCheckpointSaver[str]
    database: Database
    target: CheckpointTarget
    outages: tuple[type[BaseException], ...] = (CheckpointerUnavailable,)
    """The errors that say this database stopped answering (its driver's, for PostgreSQL)."""

    def is_outage(self, exc: BaseException) -> bool:
        """Whether `exc` says the database stopped answering (not a fault of the run)."""
        return isinstance(exc, self.outages)


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
        require("serve", "a PostgreSQL checkpointer")
        from mur.persistence.postgres import open_postgres  # noqa: PLC0415 (the serve extra)

        async with open_postgres(chosen, schema, pool_size, connect_timeout) as store:
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
    """The inline saver (a local file: a write takes well under a millisecond on the loop)
    and the caller's statements on its connection."""
    with _sqlite_saver(target, schema) as saver:
        yield CheckpointStore(saver, SqliteDatabase(saver.conn, target.shown), target)


@contextmanager
def _sqlite_saver(target: CheckpointTarget, schema: Sequence[str]) -> Iterator[InlineSqliteSaver]:
    check_folder(target)
    path = target.location
    where = path if path == MEMORY else Path(path).expanduser()
    with ExitStack() as stack:
        try:
            saver = stack.enter_context(InlineSqliteSaver.open(where, SQLITE_BUSY_TIMEOUT_S))
            for statement in schema:
                saver.conn.execute(statement)
            saver.conn.commit()
        except sqlite3.Error as exc:
            raise CheckpointerError(
                f"cannot use the checkpointer {target}: {exc}; give an SQLite file this "
                "process may write, or a new path"
            ) from None
        yield saver
