"""report.md: an evaluation's rows as Markdown tables, the MUR headline and how it is computed.

Kept apart from the numbers (evals/report/tables.py) so that the table layout can change without
touching the statistics. Accuracies arrive as fractions and print as percent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from mur.evals.report.choices import Choice
from mur.evals.report.headlines import Headline
from mur.evals.report.rows import Row, RunTime, sections
from mur.evals.report.stats import Interval, PairedComparison


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def points(value: float | None) -> str:
    """A difference of two rates in percentage points, signed (`+8.6`); `-` for none. The one
    formatter of points every report uses."""
    return "-" if value is None else f"{100 * value:+.1f}"


def _interval(low: float | None, high: float | None, fmt=_pct) -> str:
    return "" if low is None or high is None else f" [{fmt(low)}, {fmt(high)}]"


def points_span(interval: Interval | None, missing: str = "") -> str:
    """` [low, high]`: a difference's interval in points, after the difference; `missing`
    without one (a single question)."""
    return _interval(interval.low, interval.high, points) if interval else missing


def _p(value: float | None) -> str:
    if value is None:
        return "-"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _gamma(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def ratio(value: float | None) -> str:
    """`1.23x`; `-` for none."""
    return "-" if value is None else f"{value:.2f}x"


def table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table: its header, separator and one line per row of cells."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return out


def _accuracy_table(rows: Sequence[Row], paired: bool) -> list[str]:
    header = ["gate", "gamma", "questions", "accuracy % [95% CI]"]
    if paired:
        header += ["paired n", "vs always, points [95% CI]", "better / worse", "exact p"]
    lines = []
    for r in rows:
        accuracy = _pct(r.accuracy) + (
            _interval(r.accuracy_low, r.accuracy_high) or (" (n=1: no interval)")
        )
        cells = [r.gate, _gamma(r.gamma), str(r.questions), accuracy]
        if paired and r.gate == "always":
            cells += [str(r.paired_questions), "reference", "-", "-"]
        elif paired:
            cells += [
                _num(r.paired_questions),
                points(r.accuracy_diff)
                + _interval(r.accuracy_diff_low, r.accuracy_diff_high, points),
                "-" if r.better is None else f"{r.better} / {r.worse}",
                _p(r.p_value),
            ]
        lines.append(cells)
    return table(header, lines)


def _cost_table(rows: Sequence[Row], paired: bool) -> list[str]:
    header = ["gate", "gamma", "backbone tok/q", "external tok/q", "total tok/q"]
    header += ["vs always"] if paired else []
    header += ["steps/q", "scaled/q", "scaled %", "wall s/q mean", "p50", "p95"]
    lines = []
    for r in rows:
        cells = [
            r.gate,
            _gamma(r.gamma),
            _num(r.backbone_tokens),
            _num(r.external_tokens),
            _num(r.total_tokens),
        ]
        cells += [ratio(r.tokens_vs_always)] if paired else []
        cells += [
            _num(r.steps_total, 2),
            _num(r.steps_scaled, 2),
            _pct(r.scaled_share),
            _num(r.wall_mean, 1),
            _num(r.wall_p50, 1),
            _num(r.wall_p95, 1),
        ]
        lines.append(cells)
    return table(header, lines)


def _average_table(rows: Sequence[Row]) -> list[str]:
    header = ["strategy", "gate", "gamma", "questions", "accuracy %", "total tok/q", "vs always"]
    header += ["steps/q", "scaled %"]
    lines = [
        [
            r.strategy,
            r.gate,
            _gamma(r.gamma),
            str(r.questions),
            _pct(r.accuracy),
            _num(r.total_tokens),
            ratio(r.tokens_vs_always),
            _num(r.steps_total, 2),
            _pct(r.scaled_share),
        ]
        for r in rows
    ]
    return table(header, lines)


def headline_sentence(h: Headline) -> str:
    name = "MUR" if h.gate == "mur" else "MUR with bias correction"
    return (
        f"**{h.dataset} / {h.strategy}, {name} (`{h.gate}`, gamma {h.gamma:g})**: "
        f"{ratio(h.tokens_ratio)} the tokens of always ({h.tokens:,.0f} vs "
        f"{h.always_tokens:,.0f} per question); accuracy {_pct(h.accuracy)}% vs "
        f"{_pct(h.always_accuracy)}%, {_paired_clause(h.comparison, h.one_sample)}. "
        + _random_sentence(h)
    )


def _random_sentence(h: Headline) -> str:
    """MUR against random at its rate when the folder ran it; else the command's gate."""
    match = h.against_random
    if match is None:
        return (
            "Random at its rate (the matched baseline, not run here): "
            f"`--gate random@{h.random_rate:.3g}`."
        )
    p = match.pairing
    return (
        f"Against random at its rate (`{match.gate}`, which scaled {_pct(match.scaled_share)}% "
        f"of steps): {ratio(p.tokens_ratio)} its tokens ({p.tokens:,.0f} vs "
        f"{p.reference_tokens:,.0f}); accuracy {_pct(p.accuracy)}% vs "
        f"{_pct(p.reference_accuracy)}%, {_paired_clause(p.comparison, match.one_sample)}."
    )


def _paired_clause(c: PairedComparison, one_sample: bool) -> str:
    """'a difference of -3.0 points (interval ...); exact McNemar p = ... on the N questions'."""
    interval = (
        f" (95% paired bootstrap interval {points(c.interval.low)} to {points(c.interval.high)})"
        if c.interval
        else " (one question: no interval)"
    )
    plural = "" if c.better == 1 else "s"
    test = "exact McNemar" if one_sample else "exact sign test (samples averaged per question)"
    return (
        f"a difference of {points(c.difference)} points{interval}; {test} p = "
        f"{_p(c.p_value)} ({c.better} question{plural} better, {c.worse} worse), on the "
        f"{c.n} questions both ran"
    )


def duration(seconds: float) -> str:
    """3725 -> '1 h 02 min'; under an hour '7 min 05 s'."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def run_time_sentence(timing: RunTime) -> str:
    if not timing.timed_runs:
        return "Wall clock: no run carries a finished_at stamp (recorded before it existed)."
    untimed = timing.runs - timing.timed_runs
    return (
        f"Wall clock: the {timing.timed_runs} timed runs kept the server busy for "
        f"{duration(timing.busy_s)} (the union of their run intervals: overlapping runs count "
        "once, pauses between resumed sessions not at all)"
        + (f"; {untimed} earlier runs carry no timestamp." if untimed else ".")
    )


def _missing_headline(rows: Sequence[Row], gamma: float) -> list[str]:
    """Why there is no headline, per dataset and strategy."""
    out = []
    for (dataset, strategy), group in sections(rows).items():
        if not any(r.gate == "always" for r in group):
            out.append(f"- {dataset} / {strategy}: no `always` runs, so no comparison.")
            continue
        gammas = sorted({r.gamma for r in group if r.gate == "mur" and r.gamma is not None})
        if not any(math.isclose(g, gamma) for g in gammas):
            available = ", ".join(f"{g:g}" for g in gammas) or "none"
            out.append(
                f"- {dataset} / {strategy}: no `mur` runs at gamma {gamma:g} (mur gammas here: "
                f"{available}); choose one with --headline-gamma."
            )
    return out


def _choices_table(choices: Sequence[Choice]) -> list[str]:
    header = ["dataset / strategy", "gate", "gamma", "paired n", "accuracy %", "default %"]
    header += ["difference, points [95% CI]", "better / worse", "exact p", "tokens/q"]
    header += ["default tokens/q", "vs default", "scaled %"]
    lines = []
    for c in choices:
        p = c.pairing.comparison
        lines.append(
            [
                f"{c.dataset} / {c.strategy}",
                c.gate,
                _gamma(c.gamma),
                str(p.n),
                _pct(c.pairing.accuracy),
                _pct(c.pairing.reference_accuracy),
                points(p.difference) + points_span(p.interval),
                f"{p.better} / {p.worse}",
                _p(p.p_value),
                _num(c.pairing.tokens),
                _num(c.pairing.reference_tokens),
                ratio(c.pairing.tokens_ratio),
                _pct(c.scaled_share),
            ]
        )
    return table(header, lines)


def to_markdown(
    rows: Sequence[Row],
    headlines: Sequence[Headline] = (),
    *,
    source: Path | str = "records.jsonl",
    headline_gamma: float = 0.9,
    resamples: int = 10_000,
    seed: int = 0,
    run_time: RunTime | None = None,
    choices: Sequence[Choice] = (),
    plots: Sequence[str] = (),
    served: Mapping[str, Sequence[str]] | None = None,
) -> str:
    runs = sum(r.runs for r in rows if r.dataset != "average")
    lines = [
        "# Evaluation report",
        "",
        f"From `{source}`: {runs} runs, {len(sections(rows))} dataset/strategy table(s). "
        "Recompute with `mur report DIR`.",
        "",
    ]
    lines += served_lines(served or {})
    if run_time is not None:
        lines += [run_time_sentence(run_time), ""]
    # A folder without MUR runs (a baseline, or traces under gate never) has no headline to miss.
    if any(r.gate.startswith("mur") for r in rows):
        lines += [f"## Headline: MUR against always (gamma {headline_gamma:g})", ""]
        lines += [f"- {headline_sentence(h)}" for h in headlines]
        lines += _missing_headline(rows, headline_gamma)
        if not headlines and lines[-1] == "":
            lines.append("- No MUR setting shares questions with always yet.")
    if plots:
        lines += ([""] if lines[-1] else []) + [f"![{name}]({name})" for name in plots]
    for (dataset, strategy), group in sections(rows).items():
        paired = any(r.gate == "always" for r in group)
        questions = max(r.questions for r in group)
        lines += ["", f"## {dataset} / {strategy} (up to {questions} questions)", ""]
        if not paired:
            lines += [
                "No `always` runs for this dataset and strategy: no paired comparison and no "
                "token ratio against always.",
                "",
            ]
        lines += [*_accuracy_table(group, paired), "", *_cost_table(group, paired)]
    if choices:
        lines += [
            "",
            f"## MUR's settings against the default (`mur`, gamma {headline_gamma:g})",
            "",
            "What bias correction and each gamma of the sweep change against MUR as the paper "
            "runs it, on the questions both ran: the numbers to choose them by.",
            "",
            *_choices_table(choices),
        ]
    averages = [r for r in rows if r.dataset == "average"]
    if averages:
        lines += ["", "## Average over datasets (unweighted, point estimates)", ""]
        lines += _average_table(averages)
    lines += ["", "## How these numbers are computed", ""] + [
        f"- {note}" for note in _method_notes(resamples, seed)
    ]
    return "\n".join(lines) + "\n"


def served_lines(served: Mapping[str, Sequence[str]]) -> list[str]:
    """`Served by` lines, one per folder and server set (formats give different tokens, so a
    report says which made its numbers)."""
    lines = [
        f"Served by (`{folder}`, {entry})."
        for folder, entries in served.items()
        for entry in entries or ["no server recorded (a test double or a folder made before)"]
    ]
    return [*lines, ""] if lines else []


def _method_notes(resamples: int, seed: int) -> list[str]:
    return [
        "A question's score is the mean correctness of its samples; accuracy is the mean over "
        "questions, so extra samples never count as extra questions.",
        f"95% CI: percentile bootstrap over questions ({resamples:,} resamples, seed {seed}); "
        "none for a single question, zero width when every question scored the same.",
        "vs always: only the questions both this setting and `always` ran (paired n). The "
        "difference is the mean paired score difference in percentage points with its paired "
        "bootstrap interval; better / worse count the questions where this setting scored "
        "higher / lower; exact p is the two-sided binomial test of better against worse at 1/2 "
        "(McNemar's exact test when each question has one sample).",
        "Tokens: completion tokens per question; backbone = everything the solving model "
        "generated (drafts, candidates, rollouts, thinking, revisions), external = the "
        "critic/verifier model's. vs always: total tokens on the paired questions relative to "
        "always.",
        "Steps: kept steps per question and those the gate scaled; scaled % = scaled / total.",
        "Wall time: each run's latency while it shared the server with the other runs in "
        "flight (mur solve --concurrency), not the time of a question alone.",
    ]
