"""`mur solve --dataset ...`: an evaluation plan from the flags, run by evals.evaluation.

The plan records the command as it was typed (command.txt in the output folder), so a folder
says how to make it again and a rerun of that line resumes it. With `--workers N` the questions
run in N processes, each this command again with the hidden `--worker` flag
(evals.harness.pool, worker).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.cli.connection import connection_options
from mur.cli.flags import budget_settings, gammas, gates, shared_settings
from mur.evals.harness.plan import EvaluationPlan
from mur.evals.harness.pool import WorkerPool
from mur.evals.harness.shutdown import leave_stop_signals_to_parent
from mur.evals.harness.worker import Channel, serve
from mur.evals.questions import Problem, load_dataset
from mur.servers.clients.errors import ServerError
from mur.servers.connect import Connection, connect

# The prog of the solve command when run.py runs it (the card's own entry), not `mur solve`.
SCRIPT = "run.py"
# The hidden flag that makes `mur solve` one worker process of a `--workers N` run.
WORKER_FLAG = "--worker"


def command_line(argv: Sequence[str] | None, prog: str) -> str:
    """The command as it was typed, for command.txt. `argv`: the solve command's arguments
    (None: this process's); `prog`: "run.py" for the script, else the subcommand's words
    ("mur solve"), run through the `mur` console script or `python -m mur`."""
    words = list(sys.argv[1:] if argv is None else argv)
    program, *subcommand = prog.split()
    if program == SCRIPT:
        script = sys.argv[0] if argv is None else SCRIPT
        return shlex.join([_relative(sys.executable), script, *words])
    if sys.argv[0].endswith(".py"):  # `python -m mur` runs mur/__main__.py
        launcher = [_relative(sys.executable), "-m", program]
    else:  # the console script (pyproject.toml [project.scripts])
        launcher = [_relative(sys.argv[0])]
    return shlex.join([*launcher, *subcommand, *words])


def _relative(path: str) -> str:
    """`path` relative to the working folder when it lies inside it (.venv/bin/python)."""
    return os.path.relpath(path) if Path(path).is_relative_to(Path.cwd()) else path


def load_problems(args: argparse.Namespace) -> list[Problem]:
    """The --dataset's questions (--limit of them after the first --offset), read from
    --data-dir or the shipped set."""
    return load_dataset(args.dataset, args.data_dir, limit=args.limit, offset=args.offset)


def evaluation_plan(
    args: argparse.Namespace, problems: Sequence[Problem], connection: Connection, command: str
) -> EvaluationPlan:
    """The runner's typed plan (evals.harness.plan.EvaluationPlan) from the flags."""
    return EvaluationPlan(
        dataset=args.dataset,
        strategy=args.strategy,
        problems=tuple(problems),
        gates=tuple(gates(args)),
        gammas=tuple(gammas(args)),
        budgets=tuple(budget_settings(args)),
        samples=args.samples,
        concurrency=args.concurrency,
        allow_mixed_servers=args.allow_mixed_servers,
        settings=shared_settings(args, connection.recommended),
        out=Path(args.out) if args.out else None,
        command=command,
    )


def run_evaluation(
    plan: EvaluationPlan, connection: Connection, prog: str, workers: WorkerPool | None = None
) -> int:
    """Run the plan (in `workers` processes, if given) and write its report; the exit status
    (errors start with `prog`)."""
    # Here: the evaluation brings statistics and plots (scipy, matplotlib), seconds of imports
    # that a single question, or a wrong --base-url, must not wait for.
    from mur.evals.evaluation import run_evaluation as run_plan  # noqa: PLC0415

    return run_plan(plan, connection.backbone, connection.verifier, prog=prog, workers=workers)


def worker_pool(args: argparse.Namespace, argv: Sequence[str] | None) -> WorkerPool | None:
    """`--workers N` above 1: each worker is `python -m mur solve` with this command's own
    arguments (`argv`; None: this process's) and WORKER_FLAG, so it makes the same plan and
    the same connection. None: the run stays in this process."""
    if args.workers <= 1:
        return None
    words = list(sys.argv[1:] if argv is None else argv)
    return WorkerPool(args.workers, (sys.executable, "-m", "mur", "solve", *words, WORKER_FLAG))


def serve_as_worker(args: argparse.Namespace, prog: str) -> int:
    """`mur solve ... --worker`: one worker process of a --workers run (evals.harness.worker),
    its stdin and stdout the pipes to its parent. It starts no server: the parent started or
    found it, and the same arguments and environment lead here to the same address (the
    embedded server's clients still start it again if it dies, as the parent's would)."""
    leave_stop_signals_to_parent()
    channel = Channel.take_stdout()
    worker = f"{prog} (worker {os.getpid()})"
    try:
        problems = load_problems(args)
        connection = connect(**connection_options(args), eager=args.eager)
    except (ValueError, OSError, ServerError) as exc:
        print(f"{worker}: {exc}", file=sys.stderr)
        return 1
    plan = evaluation_plan(args, problems, connection, command="")
    try:
        serve(plan, connection.backbone, connection.verifier, channel)
    except Exception as exc:  # one line, not a traceback; the parent names the worker too
        print(f"{worker}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
