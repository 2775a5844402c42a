"""`mur bench formats`: its command line; serving each format, its measurements and the table
are benchmarks/formats.py's."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.benchmarks import formats
from mur.cli.args import OneLineParser, comma_choices, port_number, positive_float, positive_int
from mur.servers.processes.profiles import profiles
from mur.servers.processes.weights import WEIGHT_FORMATS

PROG = "mur bench formats"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    cpu = sorted(name for name, p in profiles().items() if p.package is not None)
    parser = OneLineParser(prog=prog, description=(formats.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--profile", default="cpu-qwen-1.5b", choices=cpu)
    parser.add_argument(
        "--formats",
        type=comma_choices(WEIGHT_FORMATS, "format"),
        default=tuple(WEIGHT_FORMATS),
        help="comma list, in order",
    )
    parser.add_argument("--offset", type=int, default=200, help="first MATH-500 question")
    parser.add_argument("--questions", type=positive_int, default=40, help="the load's questions")
    parser.add_argument("--alone", type=positive_int, default=2, help="questions timed alone")
    parser.add_argument("--warmup", type=positive_float, default=30, help="seconds before a window")
    parser.add_argument("--window", type=positive_float, default=60, help="seconds measured")
    parser.add_argument(
        "--port", type=port_number, default=formats.BENCH_PORT, help="the servers' port"
    )
    parser.add_argument("--timeout", type=positive_float, default=900, help="start timeout")
    parser.add_argument(
        "--eager", action="store_true", help="--enforce-eager servers (faster start, slower)"
    )
    parser.add_argument("--out", type=Path, help="write the measurements and table as JSON")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Every format in turn and the table; 2 when other servers share the cores."""
    args = build_parser(prog).parse_args(argv)
    return asyncio.run(formats.run(args, prog))


if __name__ == "__main__":
    sys.exit(main())
