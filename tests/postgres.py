"""A real PostgreSQL server for the tests, started in a temporary folder and stopped after.

`PostgresServer` runs the Debian binaries (`/usr/lib/postgresql/<version>/bin`, or `initdb` on
the PATH) on a free loopback port, its unix socket in its own folder. PostgreSQL refuses to run
as root: as root the commands run as the `postgres` user (`runuser`). Password authentication
over TCP (scram-sha-256), so a wrong password is refused as in production.

    server = PostgresServer.start()      # or the session fixture `postgres` (tests/conftest.py)
    url = server.create_database("t1")    # postgresql://mur:<password>@127.0.0.1:<port>/t1
    server.restart(); server.kill(); server.start_again(); server.stop()

Without PostgreSQL installed the fixture skips its tests, saying how to install it, unless
MUR_TEST_REQUIRE_POSTGRES=1 (CI), where it fails instead.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

USER = "mur"
PASSWORD = "pg-test-Xy7-secret"  # the tests check that it never appears in any output
SUPERUSER = "postgres"


class PostgresMissing(RuntimeError):
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresServer:
    """One server: its folder (data, socket, log), port and the command prefix it runs with."""

    folder: Path
    port: int
    bin: Path
    as_user: list[str]

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    @classmethod
    def start(cls) -> PostgresServer:
        """initdb a fresh cluster in a temporary folder and start it."""
        bin_dir = binaries()
        folder = Path(tempfile.mkdtemp(prefix="mur-pg-"))
        as_user: list[str] = []
        if os.geteuid() == 0:  # the server refuses root: run it as the postgres user
            owner = pwd.getpwnam(SUPERUSER)
            os.chown(folder, owner.pw_uid, owner.pw_gid)
            as_user = ["runuser", "-u", SUPERUSER, "--"]
        server = cls(folder, free_port(), bin_dir, as_user)
        pwfile = folder / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if as_user:
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        server._run(
            "initdb", "-D", str(server.data), "-U", SUPERUSER, "--auth-local=trust",
            "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "--encoding=UTF8",
        )  # fmt: skip
        server.start_again()
        with server.admin() as conn:
            conn.execute(f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'")
            conn.execute(f"CREATE DATABASE {USER} OWNER {USER}")
        return server

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / tool), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start_again(self) -> None:
        """Start the (stopped or killed) server on its port and wait until it accepts."""
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.log), "-o", options)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: cut sessions and checkpoint; `immediate`: a crash)."""
        self._run("pg_ctl", "stop", "-w", "-D", str(self.data), "-m", mode)

    def restart(self) -> None:
        self.stop()
        self.start_again()

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crashed host would leave it (its children follow)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)

    def remove(self) -> None:
        """Stop the server if it runs, and delete its folder."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str = USER, password: str = PASSWORD, user: str = USER) -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def admin(self) -> psycopg.Connection:
        """The superuser over the unix socket (trust), autocommit."""
        return psycopg.connect(
            host=str(self.folder), port=self.port, user=SUPERUSER, dbname="postgres",
            autocommit=True,
        )  # fmt: skip

    def create_database(self, name: str) -> str:
        """A new empty database owned by the test user; its URL."""
        with self.admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {name} OWNER {USER}")
        return self.url(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
