"""Two results folders side by side (`mur compare`, cli/compare.py): the same settings, paired on
the questions both ran. For two configurations of one experiment (a setting changed between
folders, say forced verdicts on and off): for every setting (dataset, strategy, gate label,
gamma) in both, on the questions both answered, the accuracy of each, the difference B - A with
its paired bootstrap interval and the exact sign test, and the tokens per question of each with
their ratio. `--samples N`: only samples 0..N-1 of each folder, a question without all N left out
(and named). `--margin POINTS`: per setting, whether B is non-inferior at that margin (the lower
95% bound of B - A strictly above it). When both folders hold recorded traces of one setting, a
traces section follows (evals.report.compare_traces): majority@k, tokens per trace, the
within-question AUROC of the final momentum, server time and tokens per server-second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mur.evals.harness.provenance import served_by
from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.markdown import points, served_lines
from mur.evals.report.pairing import Pairing, SettingKey, group_settings, pair, setting_order


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


def non_inferior(comparison: stats.PairedComparison, margin: float) -> bool:
    """Whether B is non-inferior to A at `margin` points: the lower bound of the 95% interval
    of B - A is strictly above it (no interval, a single question: not shown)."""
    interval = comparison.interval
    return interval is not None and 100 * interval.low > margin


def margin_lines(comparisons: Sequence[Comparison], margin: float) -> list[str]:
    """One non-inferiority line per setting."""
    lines = [
        f"Non-inferiority of B at {margin:g} points (the lower 95% bound of B - A strictly "
        "above the margin):",
        "",
    ]
    for c in comparisons:
        comparison = c.pairing.comparison
        interval = comparison.interval
        ci = f"[{points(interval.low)}, {points(interval.high)}]" if interval else "(no interval)"
        verdict = "yes" if non_inferior(comparison, margin) else "no"
        lines.append(
            f"- {_setting(c.key)}: B - A = {points(comparison.difference)} points {ci}: "
            f"non-inferior at {margin:g} points: {verdict}"
        )
    return [*lines, ""]


def _setting(key: SettingKey) -> str:
    dataset, strategy, gate, gamma = key
    return f"{dataset} {strategy} {gate}" + ("" if gamma is None else f" {gamma:g}")


def to_markdown(
    comparisons: Sequence[Comparison],
    folder_a: str,
    folder_b: str,
    *,
    head: Sequence[str] = (),
    margin: float | None = None,
) -> str:
    """The table, `head` lines (what --samples kept) above it, the margin's lines below."""
    lines = [
        f"A: {folder_a}  ",
        f"B: {folder_b}",
        "",
        *head,
        *served_lines(
            {f"A: {folder_a}": served_by(folder_a), f"B: {folder_b}": served_by(folder_b)}
        ),
        "| setting | questions | accuracy A % | accuracy B % | B - A, points [95% CI] | p "
        "| tokens/q A | tokens/q B | B / A |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        setting = _setting(c.key)
        p = c.pairing
        interval = p.comparison.interval
        ci = f" [{points(interval.low)}, {points(interval.high)}]" if interval else ""
        ratio = f"{p.tokens_ratio:.2f}x" if p.reference_tokens else "-"
        lines.append(
            f"| {setting} | {p.n} | {100 * p.reference_accuracy:.1f} | {100 * p.accuracy:.1f} | "
            f"{points(p.comparison.difference)}{ci} | {p.comparison.p_value:.2f} | "
            f"{p.reference_tokens:,.0f} | {p.tokens:,.0f} | {ratio} |"
        )
    if margin is not None:
        lines += ["", *margin_lines(comparisons, margin)]
    return "\n".join(lines).rstrip("\n") + "\n"
