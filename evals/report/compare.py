"""Two results folders side by side: the same settings, paired on the questions both ran.

    mur compare results/math500-critic-qwen2.5-coder-1.5b \\
        results/math500-critic-qwen2.5-coder-1.5b-forced [--out FILE]

For two configurations of one experiment (a setting changed between folders, say forced
verdicts on and off): for every setting (dataset, strategy, gate label, gamma) in both, on the
questions both answered, the accuracy of each, the difference B - A with its paired bootstrap
interval and the exact sign test, and the tokens per question of each with their ratio.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mur.evals.harness.provenance import served_by
from mur.evals.harness.records import load_records
from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.markdown import served_lines
from mur.evals.report.pairing import Pairing, SettingKey, group_settings, pair, setting_order
from mur.servers.cli import OneLineParser


@dataclass(frozen=True)
class Comparison:
    """One setting of both folders: B paired against A (the reference)."""

    key: SettingKey
    pairing: Pairing


def compare(
    records_a: Sequence[RunRecord],
    records_b: Sequence[RunRecord],
    *,
    resamples: int = stats.RESAMPLES,
) -> list[Comparison]:
    """Each setting both folders ran, on their common questions, in the report's row order."""
    a, b = group_settings(records_a), group_settings(records_b)
    out = []
    for key in a.keys() & b.keys():
        pairing = pair(b[key], a[key], resamples=resamples)
        if pairing is not None:
            out.append(Comparison(key, pairing))
    return sorted(out, key=lambda c: setting_order(c.key))


def _points(value: float) -> str:
    return f"{100 * value:+.1f}"


def to_markdown(comparisons: Sequence[Comparison], folder_a: str, folder_b: str) -> str:
    lines = [
        f"A: {folder_a}  ",
        f"B: {folder_b}",
        "",
        *served_lines(
            {f"A: {folder_a}": served_by(folder_a), f"B: {folder_b}": served_by(folder_b)}
        ),
        "| setting | questions | accuracy A % | accuracy B % | B - A, points [95% CI] | p "
        "| tokens/q A | tokens/q B | B / A |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        dataset, strategy, gate, gamma = c.key
        setting = f"{dataset} {strategy} {gate}" + ("" if gamma is None else f" {gamma:g}")
        p = c.pairing
        interval = p.comparison.interval
        ci = f" [{_points(interval.low)}, {_points(interval.high)}]" if interval else ""
        ratio = f"{p.tokens_ratio:.2f}x" if p.reference_tokens else "-"
        lines.append(
            f"| {setting} | {p.n} | {100 * p.reference_accuracy:.1f} | {100 * p.accuracy:.1f} | "
            f"{_points(p.comparison.difference)}{ci} | {p.comparison.p_value:.2f} | "
            f"{p.reference_tokens:,.0f} | {p.tokens:,.0f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


PROG = "mur compare"


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Print (and with --out, write) the table of B against A; 1 when they share nothing."""
    parser = OneLineParser(prog=prog, description=(__doc__ or "").split("\n")[0])
    parser.add_argument("a", help="results folder A (the reference)")
    parser.add_argument("b", help="results folder B")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    try:
        comparisons = compare(load_records(args.a), load_records(args.b))
    except FileNotFoundError as exc:  # not a results folder: the user's to fix
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if not comparisons:
        print(
            f"{prog}: {args.a} and {args.b} share no setting on a common question",
            file=sys.stderr,
        )
        return 1
    text = to_markdown(comparisons, args.a, args.b)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0
