"""`mur bench chaos`: its command line; the phases, the faults and the table are
benchmarks/chaos.py's."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mur.benchmarks import chaos
from mur.cli.args import OneLineParser, comma_choices, port_number

PROG = "mur bench chaos"


def kill_every(text: str) -> tuple[float, float]:
    """`--kill-every MIN:MAX` (or one number for both) as seconds, 0 < MIN <= MAX."""
    low, _, high = text.partition(":")
    try:
        bounds = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX seconds") from None
    if not 0 < bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"need 0 < MIN <= MAX, got {text}")
    return bounds


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Kill and freeze endpoint replicas and their PostgreSQL under load: "
        "nothing lost?",
    )
    parser.add_argument("--seconds", type=float, default=300.0, help="each phase's load (300)")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    parser.add_argument(
        "--kill-every",
        type=kill_every,
        default=(30.0, 60.0),
        metavar="MIN:MAX",
        help="seconds between two faults, drawn uniformly (30:60)",
    )
    parser.add_argument(
        "--faults",
        type=comma_choices(chaos.FAULTS, "fault"),
        default=chaos.FAULTS,
        help=f"the phases after the baseline, comma-separated ({','.join(chaos.FAULTS)})",
    )
    for flag, default, text in (
        ("--db-pause", 10.0, "seconds PostgreSQL stays frozen (10)"),
        ("--call-delay", 0.5, "seconds per model call (0.5)"),
        ("--lease-seconds", 10.0, "the replicas' run lease (10)"),
        ("--stream-share", 0.25, "share of streamed requests (0.25)"),
    ):
        parser.add_argument(flag, type=float, default=default, help=text)
    parser.add_argument(
        "--port",
        type=port_number,
        default=8061,
        help="the router's port; replicas take the next (8061)",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the kill schedule (0)")
    return parser


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (one line), None when nothing: refused before any
    process starts, busy ports included."""
    if args.seconds <= 0 or args.clients < 1 or args.call_delay < 0 or args.lease_seconds <= 0:
        return "--seconds, --clients and --lease-seconds must be > 0, --call-delay >= 0"
    if not 0 <= args.stream_share <= 1:
        return f"--stream-share lies in [0, 1], got {args.stream_share}"
    ports = range(args.port, args.port + chaos.REPLICAS + 1)
    busy = [port for port in ports if not chaos.port_free(port)]
    if busy:
        return (
            f"port {busy[0]} is in use (the router takes --port, its replicas the next "
            f"{chaos.REPLICAS}): pass another --port"
        )
    return None


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Every phase, the table; 0 only when nothing was lost, garbled or wrong."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    problem = check_args(args)
    if problem:
        parser.error(problem)
    return chaos.run(args, prog)


if __name__ == "__main__":
    sys.exit(main())
