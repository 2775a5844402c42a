"""`mur solve --dataset ...`: a benchmark plan from the flags, run by evals.benchmark.

The plan records the command as it was typed (command.txt in the output folder), so a folder
says how to make it again and a rerun of that line resumes it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.cli.flags import budget_settings, gammas, gates, shared_settings
from mur.evals.harness.plan import BenchmarkPlan
from mur.evals.questions import Problem, load_dataset
from mur.servers.connect import Connection

# The prog of the solve command when run.py runs it (the card's own entry), not `mur solve`.
SCRIPT = "run.py"


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


def benchmark_plan(
    args: argparse.Namespace, problems: Sequence[Problem], connection: Connection, command: str
) -> BenchmarkPlan:
    """The runner's typed plan (evals.harness.plan.BenchmarkPlan) from the flags."""
    return BenchmarkPlan(
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


def run_benchmark(plan: BenchmarkPlan, connection: Connection, prog: str) -> int:
    """Run the plan and write its report; the exit status (errors start with `prog`)."""
    # Here: the benchmark brings statistics and plots (scipy, matplotlib), seconds of imports
    # that a single question, or a wrong --base-url, must not wait for.
    from mur.evals.benchmark import run_benchmark as run_plan  # noqa: PLC0415

    return run_plan(plan, connection.backbone, connection.verifier, prog=prog)
