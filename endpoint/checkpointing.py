"""The endpoint's flags for where runs are checkpointed and how they are shared between
replicas: `--checkpointer` (or MUR_CHECKPOINTER; default an SQLite file under MUR_HOME),
`--lease-seconds`, `--keep-finished` (at least the lease), `--replica-id`; and the check at
start that the checkpointer opens, so a bad target stops the endpoint with one line naming it
(its password as `***`) before any model server is started.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from collections.abc import Callable
from pathlib import Path

from mur.endpoint.runs import DEFAULT_KEEP_FINISHED, DEFAULT_LEASE_SECONDS
from mur.persistence.checkpointers import open_checkpointer
from mur.persistence.ledger import SCHEMA
from mur.servers.processes.paths import mur_home

CHECKPOINTER_ENV = "MUR_CHECKPOINTER"
DEFAULT_FILE = Path("endpoint") / "checkpoints.sqlite"


def default_checkpointer() -> Path:
    """The embedded default: `<MUR_HOME>/endpoint/checkpoints.sqlite`."""
    return mur_home() / DEFAULT_FILE


def _seconds(minimum: float, strict: bool) -> Callable[[str], float]:
    """An argparse type: a number of seconds >= `minimum` (> with `strict`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if strict else '>='} {minimum:g}, got {text}"
            )
        return value

    return parse


def add_checkpointer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpointer",
        metavar="TARGET",
        help="where every run with an Idempotency-Key is checkpointed after each node (a run "
        "without one writes nothing: nothing could resume it): an SQLite file (one replica) "
        "or postgresql://USER:PASSWORD@HOST:PORT/DB (replicas sharing it resume each other's "
        f"runs; prefer env {CHECKPOINTER_ENV} or PGPASSWORD for the password, a flag shows in "
        f"the process list) (default: env {CHECKPOINTER_ENV}, else "
        f"$MUR_HOME/{DEFAULT_FILE.as_posix()})",
    )
    parser.add_argument(
        "--lease-seconds",
        type=_seconds(0, strict=True),
        default=DEFAULT_LEASE_SECONDS,
        help="a run is held by its replica for this long, renewed while it runs; a replica "
        "that dies leaves its runs to others once this has passed "
        f"(default {DEFAULT_LEASE_SECONDS:g})",
    )
    parser.add_argument(
        "--keep-finished",
        type=_seconds(0, strict=False),
        default=DEFAULT_KEEP_FINISHED,
        help="seconds a finished run's reply and checkpoints are kept for retries with its "
        "Idempotency-Key, and a stopped or abandoned run's for a retry to resume it; at least "
        f"--lease-seconds (default {DEFAULT_KEEP_FINISHED:g})",
    )
    parser.add_argument(
        "--replica-id",
        default=None,
        help="this process's name in the run ledger (default HOST-PID)",
    )


def keep_finished_error(args: argparse.Namespace) -> str | None:
    """Why `--keep-finished` cannot be used with `--lease-seconds` (None: it can). Shorter
    than a lease, a run that failed would be pruned before its retry resumes it, and one whose
    replica stalled past its lease pruned under that replica."""
    keep, lease = args.keep_finished, args.lease_seconds
    if keep >= lease:
        return None
    return (
        f"--keep-finished {keep:g} is shorter than --lease-seconds {lease:g}: runs must be kept "
        "at least a lease, or a stopped run is pruned before its retry resumes it; give "
        f"--keep-finished {lease:g} or more"
    )


def checkpointer_target(args: argparse.Namespace) -> str:
    """The target from `--checkpointer`, MUR_CHECKPOINTER, else the default file."""
    return args.checkpointer or os.environ.get(CHECKPOINTER_ENV) or str(default_checkpointer())


def check_checkpointer(target: str) -> None:
    """Open and set up the checkpointer once (CheckpointerError when it cannot be used); the
    default file's folder is created."""
    if target == str(default_checkpointer()):
        default_checkpointer().parent.mkdir(parents=True, exist_ok=True)

    async def probe() -> None:
        async with open_checkpointer(target, schema=SCHEMA):
            pass

    asyncio.run(probe())
