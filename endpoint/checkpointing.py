"""Where the endpoint checkpoints its runs: MUR_CHECKPOINTER, else an SQLite file under
MUR_HOME; and the check at start that the checkpointer opens, so a bad target stops the
endpoint with one line naming it (its password as `***`) before any model server is started.
The flags that choose it are cli/endpoint.py's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mur.persistence.checkpointers import open_checkpointer
from mur.persistence.ledger import SCHEMA
from mur.servers.processes.paths import mur_home

CHECKPOINTER_ENV = "MUR_CHECKPOINTER"
DEFAULT_FILE = Path("endpoint") / "checkpoints.sqlite"


def default_checkpointer() -> Path:
    """The embedded default: `<MUR_HOME>/endpoint/checkpoints.sqlite`."""
    return mur_home() / DEFAULT_FILE


def check_checkpointer(target: str) -> None:
    """Open and set up the checkpointer once (CheckpointerError when it cannot be used); the
    default file's folder is created."""
    if target == str(default_checkpointer()):
        default_checkpointer().parent.mkdir(parents=True, exist_ok=True)

    async def probe() -> None:
        async with open_checkpointer(target, schema=SCHEMA):
            pass

    asyncio.run(probe())
