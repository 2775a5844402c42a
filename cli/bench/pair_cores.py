"""`mur bench pair_cores`: its command line; starting each pair, its load and the table are
benchmarks/pair_cores.py's."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mur.benchmarks import pair_cores
from mur.cli.args import OneLineParser, comma_choices
from mur.servers.processes.launcher import CORE_SHARING

PROG = "mur bench pair_cores"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=pair_cores.__doc__)
    parser.add_argument("--profile", default="cpu-qwen-0.5b", help="the backbone's profile")
    parser.add_argument("--verifier-profile", default="cpu-qwen-1.5b")
    parser.add_argument("--limit", type=int, default=8, help="first N MATH-500 questions")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16, help="questions in flight")
    parser.add_argument(
        "--ways",
        type=comma_choices(CORE_SHARING, "way"),
        default=CORE_SHARING,
        help=f"comma list of {', '.join(CORE_SHARING)}",
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run the load once per way and print the table (stops and starts the pair's servers)."""
    args = build_parser(prog).parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="pair-cores-") as tmp:
        for cores in args.ways:
            runs.append(pair_cores.run_load(args, cores, Path(tmp) / cores))
            print(pair_cores.table(runs[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(pair_cores.table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
