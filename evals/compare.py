"""Two results folders side by side: the same settings, paired on the questions both ran.

    python -m evals.compare results/math500-critic-qwen2.5-coder-1.5b \\
        results/math500-critic-qwen2.5-coder-1.5b-forced [--out FILE]

For two configurations of one experiment (a setting changed between folders, say forced
verdicts on and off): for every setting (dataset, strategy, gate label, gamma) in both, on the
questions both answered, the accuracy of each, the difference B - A with its paired bootstrap
interval and the exact sign test, and the tokens per question of each with their ratio.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evals import stats
from evals.records import load_records
from evals.report import SettingKey, group_settings, setting_order


@dataclass(frozen=True)
class Comparison:
    key: SettingKey
    n: int
    accuracy_a: float
    accuracy_b: float
    paired: stats.PairedComparison
    tokens_a: float
    tokens_b: float


def compare(
    records_a: Sequence[dict], records_b: Sequence[dict], *, resamples: int = stats.RESAMPLES
) -> list[Comparison]:
    """Each setting both folders ran, on their common questions, in the report's row order."""
    a, b = group_settings(records_a), group_settings(records_b)
    out = []
    for key in a.keys() & b.keys():
        scores_a, scores_b = a[key].scores(), b[key].scores()
        common = sorted(scores_a.keys() & scores_b.keys())
        if not common:
            continue
        tokens_a, tokens_b = a[key].total_tokens(), b[key].total_tokens()
        paired = stats.compare_paired(
            {q: scores_b[q] for q in common}, {q: scores_a[q] for q in common}, resamples=resamples
        )
        assert paired is not None  # common is not empty
        out.append(
            Comparison(
                key=key,
                n=len(common),
                accuracy_a=stats.mean([scores_a[q] for q in common]),
                accuracy_b=stats.mean([scores_b[q] for q in common]),
                paired=paired,
                tokens_a=stats.mean([tokens_a[q] for q in common]),
                tokens_b=stats.mean([tokens_b[q] for q in common]),
            )
        )
    return sorted(out, key=lambda c: setting_order(c.key))


def _points(value: float) -> str:
    return f"{100 * value:+.1f}"


def to_markdown(comparisons: Sequence[Comparison], folder_a: str, folder_b: str) -> str:
    lines = [
        f"A: {folder_a}  ",
        f"B: {folder_b}",
        "",
        "| setting | questions | accuracy A % | accuracy B % | B - A, points [95% CI] | p "
        "| tokens/q A | tokens/q B | B / A |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        dataset, strategy, gate, gamma = c.key
        setting = f"{dataset} {strategy} {gate}" + ("" if gamma is None else f" {gamma:g}")
        interval = c.paired.interval
        ci = f" [{_points(interval.low)}, {_points(interval.high)}]" if interval else ""
        ratio = f"{c.tokens_b / c.tokens_a:.2f}x" if c.tokens_a else "-"
        lines.append(
            f"| {setting} | {c.n} | {100 * c.accuracy_a:.1f} | {100 * c.accuracy_b:.1f} | "
            f"{_points(c.paired.difference)}{ci} | {c.paired.p_value:.2f} | "
            f"{c.tokens_a:,.0f} | {c.tokens_b:,.0f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evals.compare", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("a", help="results folder A (the reference)")
    parser.add_argument("b", help="results folder B")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    try:
        comparisons = compare(load_records(args.a), load_records(args.b))
    except FileNotFoundError as exc:
        print(f"evals.compare: {exc}", file=sys.stderr)
        return 1
    if not comparisons:
        print(
            f"evals.compare: {args.a} and {args.b} share no setting on a common question",
            file=sys.stderr,
        )
        return 1
    text = to_markdown(comparisons, args.a, args.b)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
