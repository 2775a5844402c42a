"""Every bad value of the solve command, refused before any server is touched.

A wrong setting costs a user minutes when it is found only after the embedded server has
started; here each one is a UsageError (one line, exit status 2) naming the flag and the value.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mur.cli.connection import check_connection_flags
from mur.cli.flags import budget_labels, budget_settings, flag_settings, gammas, gates
from mur.graphs import STRATEGIES
from mur.graphs.state import context_for
from mur.nodes.draft import check_question
from mur.nodes.extras import require
from mur.persistence.checkpointers import CheckpointerError, check_folder, parse_target
from mur.servers.clients.errors import ServerError


class UsageError(Exception):
    """Bad command-line input: reported in one line with exit status 2."""


def validate(args: argparse.Namespace) -> None:
    """Raise UsageError (or Context's ValueError, naming the field) for the first bad value,
    MissingExtra for a feature asked for whose extra is not installed."""
    settings = {**flag_settings(args), "strategy": args.strategy}
    if STRATEGIES[args.strategy].extra:
        require(STRATEGIES[args.strategy].extra, f"the {args.strategy} strategy")
    if args.dataset:
        require("lab", "an evaluation (--dataset)")
    for label in [*gates(args), *budget_labels(args)]:
        for gamma in gammas(args):
            context_for(label, settings, gamma=gamma)
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be > 0, got {args.limit}")
    if args.offset < 0:
        raise UsageError(f"--offset must be >= 0, got {args.offset}")
    if args.offset and not args.dataset:
        raise UsageError("--offset picks a benchmark's questions: add --dataset")
    if args.samples <= 0:
        raise UsageError(f"--samples must be > 0, got {args.samples}")
    if not args.dataset:
        if len(gates(args)) > 1 or len(gammas(args)) > 1 or len(budget_settings(args)) > 1:
            raise UsageError("lists of gates, gammas or budgets need --dataset")
        if args.question is not None:
            check_question(args.question)
        if args.workers > 1:
            raise UsageError("--workers runs an evaluation in processes: add --dataset")
    elif args.question or args.checkpoint:
        raise UsageError("--question and --checkpoint solve one question: drop --dataset")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a file: give a folder (new or a run's to resume)")
    if args.out and not args.dataset:
        raise UsageError("--out is an evaluation's folder: add --dataset")
    if args.thread_id and not args.checkpoint:
        raise UsageError("--thread-id needs --checkpoint")
    if args.checkpoint:
        try:
            check_folder(parse_target(args.checkpoint))
        except CheckpointerError as exc:  # names the target, its password as ***
            raise UsageError(f"--checkpoint: {exc}") from None
    try:
        check_connection_flags(args)
    except ServerError as exc:
        raise UsageError(str(exc)) from None
