"""`mur experiment verdicts`: its command line; the replay and its report are
experiments/verdicts.py's."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.cli.args import OneLineParser
from mur.cli.connection import add_connection_arguments, connection_options
from mur.cli.experiment.publish import float_list, publish
from mur.evals.harness.records import load_records
from mur.evals.questions import load_dataset
from mur.experiments import verdicts
from mur.servers.clients.errors import ServerError
from mur.servers.connect import connect

PROG = "mur experiment verdicts"


def _shares(text: str) -> tuple[float, ...]:
    shares = float_list(text)
    if not all(0 <= share <= 1 for share in shares):
        raise argparse.ArgumentTypeError(f"shares are between 0 and 1, got {text!r}")
    return shares


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Replay the folder's critic judgements and print (or --out write) the summary."""
    parser = OneLineParser(prog=prog, description=(verdicts.__doc__ or "").split("\n")[0])
    parser.add_argument("folder", help="a results folder of critic runs (with records.jsonl)")
    add_connection_arguments(
        parser,
        defaults="The critic is the verifier: --verifier-url, else the backbone's server "
        "(--base-url); unset, from MUR_BASE_URL etc., else the embedded CPU server.",
    )
    parser.add_argument("--cap", type=int, default=256, help="the judge_max_tokens of the runs")
    parser.add_argument("--limit", type=int, default=200, help="judgements per replay")
    parser.add_argument(
        "--at",
        type=_shares,
        default=(0.0, 0.5),
        help="shares of the analysis to keep before forcing, comma-separated (default 0,0.5)",
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, help="also write the markdown summary here")
    args = parser.parse_args(argv)
    try:  # the folder and its questions: the user's to fix (exit status 2)
        records = load_records(args.folder)
        datasets = {r["dataset"] for r in records}
        questions = {p.id: p.question for name in datasets for p in load_dataset(name)}
    except (FileNotFoundError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    judgements = list(verdicts.recorded_judgements(records, questions))
    jobs = verdicts.plan(judgements, args.cap, args.limit, args.at)
    if not jobs:
        parser.error(f"{args.folder} holds no critic judgements to replay")
    try:
        verifier = connect(**connection_options(args), start=True, progress=True).verifier
        results = asyncio.run(verdicts.replay(verifier, jobs, args.concurrency))
    except ServerError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    publish(
        verdicts.report(results, args.folder, args.cap, verifier.model_name),
        args.out,
        prog,
        argv,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
