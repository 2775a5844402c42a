"""`mur bench economy`: its command line; the four measurements and their tables are
benchmarks/economy.py's."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from mur.benchmarks import economy
from mur.benchmarks.measure import DEFAULT_GATES, DEFAULT_LEVELS, DEFAULT_STRATEGIES, SMALL_SETTINGS
from mur.cli.args import OneLineParser, comma_list
from mur.cli.connection import add_connection_arguments
from mur.graphs.refine import STRATEGIES
from mur.graphs.state import context_for

PROG = "mur bench economy"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="MUR's token economy and the orchestration's speed, side by side; "
        "writes the four tables to --out.",
    )
    parser.add_argument("--questions", type=int, default=8, help="MATH-500 questions (first N)")
    parser.add_argument(
        "--strategies",
        type=comma_list(str),
        default=DEFAULT_STRATEGIES,
        help=f"refine strategies (default {','.join(DEFAULT_STRATEGIES)})",
    )
    parser.add_argument(
        "--gates",
        type=comma_list(str),
        default=DEFAULT_GATES,
        help=f"gates to compare (default {','.join(DEFAULT_GATES)})",
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="questions in flight in tables 1 and 2"
    )
    parser.add_argument(
        "--concurrency-levels",
        type=comma_list(int),
        default=DEFAULT_LEVELS,
        help="questions in flight in table 3 (default 1,2,4,8,16)",
    )
    parser.add_argument(
        "--scaling-strategy",
        default=None,
        help="strategy of table 3 (default: critic if benchmarked, else the first)",
    )
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=20.0,
        help="table 3: seconds during which new questions start at each level",
    )
    parser.add_argument(
        "--raw-seconds",
        type=float,
        default=12.0,
        help="table 3: seconds of raw completions per level (half before, half after the graph)",
    )
    parser.add_argument("--gamma", type=float, default=0.9)
    for name, default in SMALL_SETTINGS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=default, help=f"(default {default})"
        )
    parser.add_argument("--data-dir", help="benchmark data folder (default: the shipped MATH-500)")
    add_connection_arguments(
        parser,
        verifier=False,
        defaults="The vLLM server under test: --base-url, else the --profile server (default "
        f"{economy.BENCH_PROFILE}), started here or reused.",
    )
    parser.set_defaults(profile=economy.BENCH_PROFILE)
    parser.add_argument(
        "--profile-port",
        type=int,
        help="start/reuse the profile's server on this port (profile name <profile>-bench)",
    )
    parser.add_argument("--eager", action="store_true", help="start the server eager (slower)")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown file to write")
    parser.add_argument(
        "--profile-graph",
        metavar="HTML",
        help="after the tables, run the first strategy's MUR graph once more under "
        "pyinstrument (pip install pyinstrument) and write its profile here",
    )
    return parser


def check_arguments(args: argparse.Namespace, graph: dict[str, Any]) -> None:
    """Refuse what the runs could not use (ValueError naming it), before any server starts."""
    for strategy in args.strategies:
        STRATEGIES.check(strategy)
    if args.scaling_strategy:
        STRATEGIES.check(args.scaling_strategy)
    if args.questions < 2:
        raise ValueError(f"--questions must be >= 2, got {args.questions}")
    if args.concurrency < 1 or min(args.concurrency_levels) < 1:
        raise ValueError("concurrency must be >= 1")
    if args.window_seconds <= 0 or args.raw_seconds <= 0:
        raise ValueError("--window-seconds and --raw-seconds must be > 0")
    for label in args.gates:  # each label, and the settings, as the runs will use them
        context_for(label, graph, gamma=args.gamma)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run the four measurements and write their tables; 2 for bad settings."""
    args = build_parser(prog).parse_args(argv)
    graph = {name: getattr(args, name) for name in SMALL_SETTINGS}
    try:
        check_arguments(args, graph)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    command = shlex.join([*prog.split(), *(sys.argv[1:] if argv is None else argv)])
    return economy.run(args, graph, command)


if __name__ == "__main__":
    sys.exit(main())
