"""`mur bench client`: its command line; the arms, their measurement and the table are
benchmarks/client_cost.py's."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.benchmarks import client_cost
from mur.cli.args import OneLineParser, port_or_any, positive_int

PROG = "mur bench client"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    doc = client_cost.__doc__
    parser = OneLineParser(prog=prog, description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--questions", type=positive_int, default=128, help="timed per arm")
    parser.add_argument(
        "--concurrency", type=positive_int, default=64, help="questions in flight (and warm-up)"
    )
    parser.add_argument(
        "--arms", default=",".join(client_cost.ARM_NAMES), help="comma-separated arm names"
    )
    parser.add_argument("--before", type=Path, help="another checkout, measured side by side")
    parser.add_argument(
        "--port", type=port_or_any, default=0, help="the fake server's port (default: any free one)"
    )
    parser.add_argument("--out", type=Path, help="append the results to this JSON file")
    parser.add_argument("--table", action="store_true", help="print --out's table and exit")
    parser.add_argument(
        "--vllm-profile", help="measure a real vLLM server of this profile at top 0 and 20"
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """--out's table, a real server's side, or every chosen arm; 2 for bad arguments."""
    args = build_parser(prog).parse_args(argv)
    if args.table:
        if args.out is None or not args.out.exists():
            print(f"{prog}: error: --table needs an --out file that exists", file=sys.stderr)
            return 2
        print(client_cost.table(json.loads(args.out.read_text())["entries"]))
        return 0
    if args.vllm_profile:
        return client_cost.server_side(args.vllm_profile, args.questions, args.concurrency, prog)
    try:
        arms = client_cost.chosen_arms(args.arms)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.before is not None and not (args.before / "mur").is_dir():
        print(
            f"{prog}: error: --before {args.before} is not a checkout of this project "
            "(make one: git worktree add DIR COMMIT)",
            file=sys.stderr,
        )
        return 2
    return client_cost.run(arms, args)


if __name__ == "__main__":
    sys.exit(main())
