"""`mur solve` (and `python run.py`): solve one question step by step, or run an evaluation.

    mur solve --strategy critic                       # the built-in sample problem
    mur solve --strategy critic --question "..." --json
    mur solve --strategy critic --dataset math500 --limit 8 --gate mur,always,never --out DIR
    mur solve --strategy critic --dataset math500 --workers 4 --out DIR   # in 4 processes

Without --base-url (or MUR_BASE_URL) it uses the embedded CPU vLLM server (reused when
healthy, started if not). With --workers each worker process is this command again, with the
hidden --worker flag (evals.harness.pool says why).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence

from mur.cli.args import OneLineParser, positive_int, usage_error
from mur.cli.connection import add_connection_arguments, connection_options
from mur.cli.evaluation import (
    WORKER_FLAG,
    command_line,
    evaluation_plan,
    load_problems,
    run_evaluation,
    serve_as_worker,
    worker_pool,
)
from mur.cli.flags import add_context_flags
from mur.cli.printer import Printer
from mur.cli.question import solve_question
from mur.cli.validation import UsageError, validate
from mur.evals.questions.datasets import describe as describe_datasets
from mur.graphs.model_calls import describe_failure, server_roles
from mur.nodes.extras import MissingExtra
from mur.persistence.checkpointers import CheckpointerError
from mur.servers.clients.errors import ServerError
from mur.servers.connect import Connection
from mur.servers.connect import connect as connect_servers

PROG = "mur solve"
INTERRUPTED_EXIT = 130  # a shell's status for Ctrl-C


def _concurrency(text: str) -> int | None:
    """`auto` (None: measured) or a positive number of questions."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or 'auto': {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or 'auto'), got {value}")
    return value


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """Every Context setting as a flag, then the question, the servers and the evaluation."""
    parser = OneLineParser(
        prog=prog, description="MUR: momentum-uncertainty-guided step-level reasoning."
    )
    add_context_flags(parser)
    parser.add_argument("--question", help="the question to solve (default: a sample problem)")
    parser.add_argument("--system-prompt", default=None)
    add_connection_arguments(parser)
    parser.add_argument("--eager", action="store_true", help="start the embedded server eager")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--dataset", help=f"evaluate on a benchmark: {describe_datasets()}")
    parser.add_argument("--data-dir", help="benchmark data folder (or 'hf' for the hub)")
    parser.add_argument("--limit", type=int, help="first N questions of the dataset")
    parser.add_argument(
        "--offset",
        type=int,
        default=0,
        help="skip the dataset's first N questions (file order): --offset 200 --limit 200 "
        "runs questions 201-400",
    )
    parser.add_argument("--samples", type=int, default=1, help="samples per question")
    parser.add_argument(
        "--concurrency",
        type=_concurrency,
        default=None,
        help="questions in flight (default auto: measured on the servers at 8/16/32/64 "
        "streams, recorded in the folder's settings.json)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="with --dataset: run the questions in N processes, --concurrency split between "
        "them, for a fast GPU server where one client process (one core) is the bottleneck; "
        "no help on a CPU vLLM server, which is itself the bottleneck (default 1)",
    )
    # A worker process of a --workers run, started by it with the same arguments.
    parser.add_argument(WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--allow-mixed-servers",
        action="store_true",
        help="resume an evaluation folder on a server whose dtype, vLLM version or logprobs "
        "mode differs from the recorded one (the mix is recorded)",
    )
    parser.add_argument("--out", help="evaluation output folder (records.jsonl, tables)")
    parser.add_argument(
        "--checkpoint",
        metavar="TARGET",
        help="checkpoint the run after every node, resumable: an SQLite file, or "
        "postgresql://USER:PASSWORD@HOST:PORT/DB (prefer PGPASSWORD for the password)",
    )
    parser.add_argument(
        "--thread-id", help="the run's id in --checkpoint: the same id resumes where it stopped"
    )
    return parser


def connect(args: argparse.Namespace, say: Callable[[str], None]) -> Connection:
    """Clients from the flags, else MUR_BASE_URL etc., else the embedded CPU server (started
    if needed): `servers.connect`, probing every URL first so a wrong one fails in seconds."""
    connection = connect_servers(
        **connection_options(args),
        start=True,
        eager=args.eager,
        progress=not args.json,
        say=say,
    )
    args.profile = connection.profile
    return connection


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Parse, validate, connect, then solve the question or run the evaluation; the exit
    status (2: bad input, 1: a server or the run failed, 130: interrupted)."""
    args = build_parser(prog).parse_args(argv)
    if args.worker:
        return serve_as_worker(args, prog)
    try:
        validate(args)
        problems = load_problems(args) if args.dataset else None
    except MissingExtra as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except (UsageError, ValueError, OSError) as exc:
        return usage_error(prog, str(exc))

    printer = Printer(enabled=not args.json)
    try:
        connection = connect(args, printer.say)
    except ServerError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    if problems is not None:
        plan = evaluation_plan(args, problems, connection, command_line(argv, prog))
        return run_evaluation(plan, connection, prog, worker_pool(args, argv))
    try:
        result = asyncio.run(solve_question(args, connection, printer))
    except CheckpointerError as exc:  # names the target, its password as ***
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        hint = " (rerun with the same --checkpoint and --thread-id to resume)" * bool(
            args.checkpoint
        )
        print(f"{prog}: interrupted{hint}", file=sys.stderr)
        return INTERRUPTED_EXIT
    except Exception as exc:  # one clear line instead of a traceback; exit status 1
        roles = server_roles(connection.backbone, connection.verifier)
        check = "`mur servers status`" if connection.embedded else None
        print(f"{prog}: {describe_failure(exc, roles, check)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        printer.result(result)
    return 0
