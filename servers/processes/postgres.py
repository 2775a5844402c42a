"""A throwaway PostgreSQL server: a fresh cluster in a folder of its own, on a free loopback
port, for the endpoint's checkpointer when nothing else provides one (the chaos benchmark, the
tests, a user trying replicas on one machine).

It runs the Debian binaries (`/usr/lib/postgresql/<version>/bin`, else `initdb` on the PATH;
`apt-get install postgresql`). PostgreSQL refuses to run as root, so as root its commands run
as the `postgres` user (`runuser`), as Debian's own service does. Password authentication over
TCP (scram-sha-256), so a wrong password is refused as in production; the superuser connects
over the server's own unix socket (trust), which only the folder's owner can reach.

    with PostgresServer.start() as server:          # a random password unless one is given
        url = server.create_database("runs")         # postgresql://mur:<password>@127.0.0.1:<port>/runs
        server.restart(); server.kill(); server.start_again()

The password is in `url()` alone: `str(server)`, its repr and every error show `***`, and the
initdb password file is deleted once the cluster exists.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

import psutil
import psycopg
from psycopg import sql

from mur.servers.clients.errors import ServerError
from mur.servers.processes.replicas import free_port

SUPERUSER = "postgres"
"""The cluster's superuser, and the system user the server runs as under root."""
DEFAULT_USER = "mur"
COMMAND_TIMEOUT_S = 120
StopMode = Literal["smart", "fast", "immediate"]


class PostgresMissing(ServerError):
    """No PostgreSQL binaries on this machine."""


def binaries() -> Path:
    """The folder of initdb/pg_ctl: the newest Debian install, else the PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    initdb = found[-1] if found else shutil.which("initdb")
    if not initdb:
        raise PostgresMissing(
            "PostgreSQL is not installed: apt-get install postgresql (or put initdb and "
            "pg_ctl on the PATH)"
        )
    return Path(initdb).parent


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix the server's tools run with, and the account they run as (None:
    this process's own). Root cannot run PostgreSQL: its tools then run as `postgres`."""
    if os.geteuid() != 0:
        return [], None
    try:
        owner = pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise ServerError(
            f"PostgreSQL refuses to run as root and there is no {SUPERUSER!r} user to run it "
            f"as: install the postgresql package (it creates one) or run as another user"
        ) from None
    return ["runuser", "-u", SUPERUSER, "--"], owner


def _identifier(name: str, what: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(f"{what} {name!r} must be lower-case letters, digits and _ (<= 63)")
    return name


@dataclass
class PostgresServer:
    """One cluster: its folder (data, socket, log), port, the user it was made for, and the
    command prefix its tools run with."""

    folder: Path
    port: int
    bin: Path
    as_user: list[str]
    user: str = DEFAULT_USER
    password: str = field(default="", repr=False)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def __str__(self) -> str:
        return f"PostgreSQL on 127.0.0.1:{self.port} (user {self.user}, folder {self.folder})"

    @classmethod
    def start(
        cls, *, user: str = DEFAULT_USER, password: str | None = None, folder: Path | None = None
    ) -> PostgresServer:
        """initdb a fresh cluster (in a new temporary folder unless `folder` is given), start
        it, and create `user` with `password` (random by default) and a database of its name.
        ServerError (PostgresMissing when it is not installed) naming what failed."""
        bin_dir = binaries()
        as_user, owner = _run_as()
        home = folder or Path(tempfile.mkdtemp(prefix="mur-pg-"))
        home.mkdir(parents=True, exist_ok=True)
        server = cls(home, free_port(), bin_dir, as_user, _identifier(user, "user"))
        server.password = password or secrets.token_urlsafe(18)
        if owner is not None:
            os.chown(home, owner.pw_uid, owner.pw_gid)
        try:
            server._initdb(owner)
            server.start_again()
            with server.admin() as conn:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(user), sql.Literal(server.password)
                    )
                )
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(user), sql.Identifier(user)
                    )
                )
        except BaseException:
            server.remove()
            raise
        return server

    def _initdb(self, owner: pwd.struct_passwd | None) -> None:
        """A new cluster whose superuser has a random password nobody uses (it connects over
        the unix socket), written to a file initdb reads and deleted at once."""
        pwfile = self.folder / "pwfile"
        pwfile.write_text(secrets.token_urlsafe(18) + "\n")
        pwfile.chmod(0o600)
        if owner is not None:
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        try:
            self._run(
                "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth-local=trust",
                "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "--encoding=UTF8",
            )  # fmt: skip
        finally:
            pwfile.unlink(missing_ok=True)

    def _run(self, tool: str, *args: str) -> None:
        try:
            subprocess.run(
                [*self.as_user, str(self.bin / tool), *args],
                check=True,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
            )
        except subprocess.CalledProcessError as exc:
            said = " ".join((exc.stderr or exc.stdout or "").split())[-400:]
            raise ServerError(
                f"PostgreSQL's {tool} failed in {self.folder} (exit {exc.returncode}): {said}; "
                f"its log: {self.log}"
            ) from None

    def start_again(self) -> None:
        """Start the (stopped or killed) server on its port and wait until it accepts."""
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.log), "-o", options)

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server (`fast`: cut sessions and checkpoint; `immediate`: a crash)."""
        self._run("pg_ctl", "stop", "-w", "-D", str(self.data), "-m", mode)

    def restart(self) -> None:
        """A fast restart: sessions cut, the server back on the same port."""
        self.stop()
        self.start_again()

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crashed host would leave it (its children follow)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every session: connections stay open and nothing
        answers, as a network partition or a stalled host looks to a client."""
        for process in self._processes():
            process.suspend()

    def thaw(self) -> None:
        """SIGCONT what `freeze` stopped."""
        for process in self._processes():
            process.resume()

    def _processes(self) -> list[psutil.Process]:
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        return [postmaster, *postmaster.children(recursive=True)]

    def remove(self) -> None:
        """Stop the server if it runs, and delete its folder."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(ServerError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.remove()

    def url(self, database: str | None = None, password: str | None = None, user: str = "") -> str:
        """`postgresql://USER:PASSWORD@127.0.0.1:PORT/DATABASE` (it holds the password: pass
        it in the environment, never print it)."""
        who = user or self.user
        secret = self.password if password is None else password
        return f"postgresql://{who}:{secret}@127.0.0.1:{self.port}/{database or self.user}"

    def admin(self) -> psycopg.Connection:
        """The superuser over the unix socket (trust), autocommit."""
        return psycopg.connect(
            host=str(self.folder), port=self.port, user=SUPERUSER, dbname="postgres",
            autocommit=True,
        )  # fmt: skip

    def create_database(self, name: str) -> str:
        """A new empty database (dropped first if it exists) owned by the user; its URL."""
        database = sql.Identifier(_identifier(name, "database"))
        with self.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(database))
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(database, sql.Identifier(self.user))
            )
        return self.url(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
