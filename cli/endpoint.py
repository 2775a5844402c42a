"""`mur endpoint`: serve MUR as an OpenAI-compatible API with uvicorn.

    mur endpoint [--host 127.0.0.1] [--port 8100] [--base-url URL --model NAME]
        [--verifier-url URL --verifier-model NAME] [--profile NAME] [--api-key KEY]
        [--max-runs 64] [--max-request-bytes 1048576] [--checkpointer TARGET]
        [--lease-seconds 30] [--keep-finished 3600] [--replica-id NAME] [--drain-seconds 30]
        [--replicas N]

It listens on loopback unless `--host` says otherwise. The API keys come from `--api-key`
(repeated for several callers) or, better (a flag shows in `ps`), the environment variable
MUR_API_KEY (comma-separated); they are never printed. Runs are checkpointed where
`--checkpointer` says, checked before any model server starts (endpoint/checkpointing.py).
SIGTERM drains the runs in flight before the process exits (endpoint/drain.py).
`--replicas N` runs N of these behind vllm-router instead (endpoint/replicas.py).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from mur.cli.args import MAX_PORT, OneLineParser, port_number, positive_int, usage_error
from mur.cli.connection import add_connection_arguments, check_connection_flags, connection_options
from mur.endpoint.app import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RUNS, create_app
from mur.endpoint.checkpointing import (
    CHECKPOINTER_ENV,
    DEFAULT_FILE,
    check_checkpointer,
    default_checkpointer,
)
from mur.endpoint.drain import DEFAULT_GRACE_SECONDS, DrainingServer
from mur.endpoint.guards import api_keys
from mur.endpoint.replicas import serve_replicas
from mur.endpoint.runs import DEFAULT_KEEP_FINISHED, DEFAULT_LEASE_SECONDS
from mur.endpoint.schemas import MODELS
from mur.persistence.checkpointers import CheckpointerError, parse_target
from mur.servers import ServerError
from mur.servers.clients.collector import tune_collector
from mur.servers.connect import connect as connect_servers

PROG = "mur endpoint"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100
API_KEY_ENV = "MUR_API_KEY"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
KEEP_ALIVE_SECONDS = 65
"""How long an idle client connection stays open. uvicorn's 5 s default loses requests under
load: when the event loop is busy for longer, the idle timer can close a connection whose next
request has already arrived, and the client reads a reset (BENCHMARKS.md, the endpoint under
load). Above the 60 s idle timeout of common proxies and balancers."""
CLOSE_SECONDS = 5
"""After a drain, how long uvicorn waits for open connections to close before it exits."""


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


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Serve MUR (every strategy x gate) as an OpenAI-compatible chat API.",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"interface to listen on (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port to listen on, 1-{MAX_PORT} (default {DEFAULT_PORT})",
    )
    add_connection_arguments(parser)
    parser.add_argument(
        "--eager", action="store_true", help="start the embedded server eager (faster start)"
    )
    parser.add_argument(
        "--api-key",
        action="append",
        help="require this bearer key on every route but /health; repeat it for several "
        "callers, each with runs of its own (default: env "
        f"{API_KEY_ENV}, comma-separated; prefer the variable, a flag shows in the process list)",
    )
    parser.add_argument(
        "--max-runs",
        type=positive_int,
        default=DEFAULT_MAX_RUNS,
        help="graph runs at once; more requests get 429 with Retry-After "
        f"(default {DEFAULT_MAX_RUNS})",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"largest request body; larger get 413 (default {DEFAULT_MAX_REQUEST_BYTES:,})",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="uvicorn's and this endpoint's (no 'trace': uvicorn would log request headers, "
        "and with them the API key)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        metavar="S",
        help="on SIGTERM or Ctrl-C, runs in flight get this long to finish while new ones get "
        "503; the rest stop at their last checkpoint, a retry with their key resumes them "
        f"elsewhere; a second signal exits at once (default {DEFAULT_GRACE_SECONDS:.0f})",
    )
    add_checkpointer_arguments(parser)
    parser.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        metavar="N",
        help="run N endpoint processes (ports PORT+1..PORT+N) sharing a PostgreSQL "
        "--checkpointer, with vllm-router on --host:--port in front; any replica resumes "
        "another's runs (default 1: this process alone)",
    )
    return parser


def connect(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any], str]:
    """(backbone, verifier, default settings, description) from flags, env or the embedded
    server (started if it is not running, as `mur solve` does), through the serving layer's
    one `connect`: every URL is probed first, so a wrong one fails at start in seconds, naming
    it."""
    connection = connect_servers(
        **connection_options(args),
        start=True,
        eager=args.eager,
        progress=True,
        say=lambda text: print(text, file=sys.stderr, flush=True),
    )
    defaults = dict(connection.recommended)
    note = connection.note
    if connection.profile:
        note += f"; defaults of profile {connection.profile}: {defaults}"
    return connection.backbone, connection.verifier, defaults, note


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_replicas(args: argparse.Namespace, checkpointer: str) -> str | None:
    """What makes `--replicas N` impossible with these flags (None: nothing)."""
    try:
        target = parse_target(checkpointer)
    except CheckpointerError:
        return None  # named by the checkpointer check itself
    if target.kind != "postgres":
        return (
            f"--replicas {args.replicas} needs a PostgreSQL checkpointer the replicas share "
            f"(--checkpointer postgresql://USER:PASSWORD@HOST:PORT/DB or {CHECKPOINTER_ENV}), "
            f"got {target}"
        )
    if args.port > MAX_PORT - args.replicas:  # the parser took 1..MAX_PORT (port_number)
        return f"--port {args.port} leaves no room for {args.replicas} replica ports above it"
    return None


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Serve until SIGTERM or Ctrl-C (drained: 0); 2 for bad flags, 1 when no server or app
    can be made or a second signal cut the drain short."""
    args = build_parser(prog).parse_args(argv)
    try:
        check_connection_flags(args)
    except ServerError as exc:  # flags that cannot work together: the user's to fix
        return usage_error(prog, str(exc))
    if (kept_too_short := keep_finished_error(args)) is not None:
        return usage_error(prog, kept_too_short)
    api_key = api_keys(args.api_key, os.environ.get(API_KEY_ENV))
    checkpointer = checkpointer_target(args)
    if args.replicas > 1:  # this process supervises N of them behind a router instead
        if (problem := check_replicas(args, checkpointer)) is not None:
            return usage_error(prog, problem)
        return serve_replicas(args, build_parser(prog), api_key, checkpointer, prog)
    try:
        check_checkpointer(checkpointer)  # before a model server is started for nothing
        backbone, verifier, defaults, note = connect(args)
        app = create_app(
            backbone,
            verifier,
            defaults=defaults,
            api_key=api_key,
            max_runs=args.max_runs,
            max_request_bytes=args.max_request_bytes,
            checkpointer=checkpointer,
            lease_seconds=args.lease_seconds,
            keep_finished=args.keep_finished,
            replica_id=args.replica_id,
        )
    except (ServerError, CheckpointerError, KeyError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    tune_collector()  # start-up is done: what it left stays, off the collector's path
    guard = "API key required" if api_key else "no API key"
    print(
        f"MUR endpoint on http://{args.host}:{args.port}/v1 ({len(MODELS)} models, {guard}, "
        f"at most {args.max_runs} runs at once, checkpointed in {parse_target(checkpointer)}); "
        f"{note}",
        file=sys.stderr,
        flush=True,
    )
    if not api_key and not is_loopback(args.host):
        print(
            f"{prog}: warning: listening on {args.host} without an API key: anyone who reaches "
            f"this port can spend the backbone's compute (set {API_KEY_ENV})",
            file=sys.stderr,
            flush=True,
        )
    logging.basicConfig(format="%(levelname)-9s %(name)s: %(message)s")
    logging.getLogger("mur.endpoint").setLevel(args.log_level.upper())
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=CLOSE_SECONDS,
    )
    server = DrainingServer(config, app.state.service, grace_s=args.drain_seconds)
    server.run()
    return 1 if server.forced else 0


if __name__ == "__main__":  # each replica of `mur endpoint --replicas N` (endpoint/replicas.py)
    sys.exit(main())
