"""`mur bench endpoint_load`: its command line; the load, the checks and the report are
benchmarks/endpoint_load.py's."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mur.benchmarks import endpoint_load
from mur.cli.args import OneLineParser, port_number
from mur.cli.connection import add_connection_arguments, connection_argv

PROG = "mur bench endpoint_load"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Load-test the MUR endpoint and check every reply.",
    )
    parser.add_argument("--backbone", choices=("fake", "cpu"), default="fake")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    parser.add_argument("--requests", type=int, help="requests in all (fake 1024, cpu 128)")
    parser.add_argument("--stream-share", type=float, default=0.5, help="share streamed (0.5)")
    parser.add_argument(
        "--fault-share", type=float, default=0.05, help="fake: share with injected faults (0.05)"
    )
    parser.add_argument("--max-runs", type=int, help="the endpoint's run limit (default: clients)")
    parser.add_argument(
        "--port", type=port_number, help="the endpoint's port (fake 8051, cpu 8052)"
    )
    add_connection_arguments(
        parser,
        defaults="--backbone cpu: the servers the endpoint under test uses (passed on to "
        f"`mur endpoint`); default --base-url {endpoint_load.CPU_BASE_URL}.",
    )
    parser.set_defaults(base_url=endpoint_load.CPU_BASE_URL)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Load-test, print the report; 0 only when every check passed."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    args.requests = args.requests or (1024 if args.backbone == "fake" else 128)
    args.port = args.port or (8051 if args.backbone == "fake" else 8052)
    if args.clients < 1 or args.requests < 1 or (args.max_runs is not None and args.max_runs < 1):
        parser.error("--clients, --requests and --max-runs must be >= 1")
    if not (0 <= args.stream_share <= 1 and 0 <= args.fault_share <= 1):
        parser.error("--stream-share and --fault-share lie in [0, 1]")
    try:
        report = endpoint_load.run(args, connection_argv(args))
    except RuntimeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    endpoint_load.print_report(report, args.json)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
