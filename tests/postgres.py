"""The tests' PostgreSQL: the package's throwaway server (servers/processes/postgres.py) with a
fixed password, so a test can check that it never appears in any output.

    server = start()                      # or the session fixture `postgres` (tests/conftest.py)
    url = server.create_database("t1")    # postgresql://mur:<PASSWORD>@127.0.0.1:<port>/t1
    server.restart(); server.kill(); server.start_again(); server.remove()

Without PostgreSQL installed the fixture skips its tests, saying how to install it, unless
MUR_TEST_REQUIRE_POSTGRES=1 (CI), where it fails instead.
"""

from __future__ import annotations

from mur.servers.processes.postgres import (
    DEFAULT_USER,
    SUPERUSER,
    PostgresMissing,
    PostgresServer,
    binaries,
)
from mur.servers.processes.replicas import free_port

USER = DEFAULT_USER
PASSWORD = "pg-test-Xy7-secret"  # the tests check that it never appears in any output

__all__ = [
    "PASSWORD",
    "SUPERUSER",
    "USER",
    "PostgresMissing",
    "PostgresServer",
    "binaries",
    "free_port",
    "start",
]


def start() -> PostgresServer:
    """A fresh server for the tests, its user `mur` with the password PASSWORD."""
    return PostgresServer.start(user=USER, password=PASSWORD)
