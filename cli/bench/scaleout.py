"""`mur bench scaleout`: its command line; the servers, the load, the counters and the table
are benchmarks/scaleout.py's."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from mur.benchmarks import scaleout
from mur.cli.args import OneLineParser, usage_error
from mur.evals.questions import load_dataset
from mur.servers.clients.errors import ServerError
from mur.servers.processes.paths import mur_home
from mur.servers.processes.replicas import POLICIES

PROG = "mur bench scaleout"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Prefix-cache hit rate and tok/s: one vLLM CPU server vs two replicas "
        "behind vllm-router, with and without session affinity.",
    )
    parser.add_argument("--questions", type=int, default=16, help="first N MATH-500 questions")
    parser.add_argument("--strategy", default="critic")
    parser.add_argument("--gate", default="mur")
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--concurrency", type=int, default=8, help="questions in flight")
    parser.add_argument(
        "--policies",
        default="consistent_hash,round_robin",
        help="router policies to measure with two replicas (comma-separated)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8031,
        help="router (or the single server) port; the replicas take the next two",
    )
    parser.add_argument(
        "--max-others-cpu",
        type=float,
        default=0.25,
        help="before each measurement, wait (up to 30 min) until other processes use at most "
        "this share of the CPU",
    )
    parser.add_argument("--home", type=Path, default=None, help="private MUR_HOME for records")
    parser.add_argument("--data-dir", help="benchmark data folder (default: the shipped MATH-500)")
    parser.add_argument("--eager", action="store_true", help="start the servers eager")
    parser.add_argument("--start-timeout", type=float, default=1800)
    parser.add_argument("--json", dest="json_out", help="also write the phases to this file")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the configurations and the runs each would make; start no server",
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Measure each configuration (or --dry-run print them); 2 for bad settings."""
    args = build_parser(prog).parse_args(argv)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        return usage_error(
            prog,
            f"--policies {args.policies}: {', '.join(unknown)} unknown; policies must be among "
            f"{', '.join(POLICIES)}",
        )
    if args.questions <= 0 or args.concurrency <= 0:
        return usage_error(
            prog,
            f"--questions and --concurrency must be > 0, got {args.questions} and "
            f"{args.concurrency}",
        )
    args.home = args.home or mur_home() / "scaleout"
    try:
        problems = load_dataset("math500", args.data_dir, limit=args.questions)
        plan = scaleout.describe_plan([scaleout.ONE, *policies], problems, args)
    except (ValueError, OSError) as exc:  # a bad strategy, label or data folder
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(plan)
        return 0
    phases: list[scaleout.Phase] = []
    # A `kill` stops the servers too: SystemExit unwinds through `measure`'s cleanup.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for case in [scaleout.ONE, *policies]:
            phases.append(scaleout.measure(case, problems, args))
            print(scaleout.table(phases[-1:]), file=sys.stderr)
    except ServerError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    command = shlex.join([*prog.split(), *(sys.argv[1:] if argv is None else argv)])
    print(
        f"{command}\n{len(problems)} MATH-500 questions, strategy {args.strategy}, gate "
        f"{args.gate} (gamma {args.gamma}), concurrency {args.concurrency}, "
        f"{', '.join(f'{k}={v}' for k, v in scaleout.SMALL_SETTINGS.items())}, "
        f"{'eager' if args.eager else 'compiled'} cpu-tiny servers, {os.cpu_count()} cores\n"
    )
    print(scaleout.table(phases))
    for phase in phases:
        for error in phase.errors:
            print(f"{phase.case}: {error}", file=sys.stderr)
    if args.json_out:
        data = [
            {**asdict(p), "hit_rate": p.hit_rate, "tokens_per_s": p.tokens_per_s} for p in phases
        ]
        Path(args.json_out).write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
