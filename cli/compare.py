"""`mur compare`: two results folders side by side, paired on the questions both ran (the
numbers, and for two folders of traces their traces section: evals.report.compare).

    mur compare A B [--samples N] [--margin POINTS] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from mur.cli.args import OneLineParser, positive_int
from mur.evals.harness.records import load_records
from mur.evals.report.compare import (
    compare,
    compare_traces,
    first_samples,
    samples_lines,
    to_markdown,
    traces_markdown,
)


def finite_number(text: str) -> float:
    """argparse type: any finite number (a bad value is the parser's one-line error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


PROG = "mur compare"


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Print (and with --out, write) B against A: the table, the margin's lines, the traces
    section; 1 when they share nothing."""
    parser = OneLineParser(
        prog=prog,
        description="Two results folders side by side: the same settings, paired on the "
        "questions both ran.",
    )
    parser.add_argument("a", help="results folder A (the reference)")
    parser.add_argument("b", help="results folder B")
    parser.add_argument(
        "--samples",
        type=positive_int,
        metavar="N",
        help="only records with sample < N, in both folders (a question without all N is "
        "left out and named)",
    )
    parser.add_argument(
        "--margin",
        type=finite_number,
        metavar="POINTS",
        help="non-inferiority margin of B - A in points (e.g. -2): per setting, whether the "
        "lower 95%% bound is above it",
    )
    parser.add_argument("--out", type=Path, help="also write the whole output here")
    args = parser.parse_args(argv)
    try:
        selected = [first_samples(load_records(f), args.samples) for f in (args.a, args.b)]
    except (FileNotFoundError, ValueError) as exc:  # not a results folder, or a corrupt one
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    a, b = selected
    comparisons = compare(a.records, b.records)
    if not comparisons:
        print(
            f"{prog}: {args.a} and {args.b} share no setting on a common question",
            file=sys.stderr,
        )
        return 1
    head = [] if args.samples is None else samples_lines(args.samples, a, b)
    text = to_markdown(comparisons, args.a, args.b, head=head, margin=args.margin)
    traces = compare_traces(a, b)
    if traces is not None:
        text += "\n" + traces_markdown(traces)
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0
