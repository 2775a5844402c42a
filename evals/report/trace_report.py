"""The trace section of a report: the hypotheses of a pre-registration (evals.report.preregs:
H4-H7 of results/prereg-parallel-traces.md by default) decided on the replayed rules
(evals.report.traces) and the live folders beside them (evals.report.live), accuracy against
k, the AUROC table and one plot of accuracy against tokens for every rule."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from mur.evals.harness.run_record import RunRecord, total_tokens
from mur.evals.report import stats
from mur.evals.report.live import LiveArm, LiveRow, compare, first_ids, restricted
from mur.evals.report.live import markdown as live_markdown
from mur.evals.report.markdown import points
from mur.evals.report.preregs import PREREGS, Decision, Evidence, still_recording
from mur.evals.report.traces import (
    SIGNALS,
    Auroc,
    Prediction,
    RuleResult,
    majority_at,
    named_rules,
    prediction_interval,
    question_traces,
    recorded_context,
    run_rule,
    within_question_auroc,
)

PLOT_NAME = "traces_accuracy_vs_tokens.png"
DEFAULT_PREREG = "parallel-traces"


@dataclass(frozen=True)
class TraceAnalysis:
    questions: int
    traces: int
    incomplete: list[str]
    single_accuracy: float
    at_k: list[float]
    aurocs: list[Auroc]
    rules: list[RuleResult]
    decisions: list[Decision]
    prereg: str
    live: list[LiveRow]
    waiting: list[str]
    """Live folders given with no question to compare yet (their run has not finished one)."""


def analyse(
    records: Sequence[RunRecord],
    *,
    prereg: str = DEFAULT_PREREG,
    arms: Sequence[LiveArm] = (),
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> TraceAnalysis:
    """Every rule replayed on the recorded traces, the live arms beside them, and the
    pre-registration's hypotheses decided on both."""
    questions, incomplete = question_traces(records)
    if not questions:
        raise ValueError("no question has all its traces recorded")
    k = len(questions[0].traces)
    rules = {name: run_rule(name, questions, r) for name, r in named_rules(k).items()}
    majority = rules["majority"].per_question
    registered = PREREGS[prereg]
    kept: dict[str, LiveArm] = {}
    rows: dict[str, LiveRow] = {}
    recorded = len(questions) + len(incomplete)
    recording = still_recording(recorded, registered.questions)
    for arm in arms:
        registered.check_arm(arm)
        kept[arm.name], left_out, unrecorded = restricted(
            arm, majority, incomplete, recording=recording
        )
        if kept[arm.name].per_question:
            rows[arm.name] = compare(
                kept[arm.name],
                majority,
                left_out=left_out,
                unrecorded=len(unrecorded),
                resamples=resamples,
                seed=seed,
            )
    aurocs = [
        within_question_auroc(questions, signal, name, resamples=resamples, seed=seed)
        for name, signal in SIGNALS.items()
    ]
    return TraceAnalysis(
        questions=len(questions),
        traces=k,
        incomplete=sorted(incomplete),
        single_accuracy=float(sum(q.single_accuracy for q in questions) / len(questions)),
        at_k=[sum(majority_at(q, j) for q in questions) / len(questions) for j in range(1, k + 1)],
        aurocs=aurocs,
        rules=list(rules.values()),
        decisions=registered.decide(
            Evidence(
                questions=questions,
                recorded=recorded,
                k=k,
                rules=rules,
                aurocs=aurocs,
                arms=kept,
                rows=rows,
                resamples=resamples,
                seed=seed,
                planned=registered.questions,
            )
        ),
        prereg=prereg,
        live=list(rows.values()),
        waiting=[f"{a.name} (`{a.folder}`)" for a in kept.values() if a.name not in rows],
    )


# ---------------------------------------------------------------------------- output


def _span(interval: stats.Interval | None, scale: float = 100, fmt: str = "+.1f") -> str:
    if interval is None:
        return "-"
    return f"[{interval.low * scale:{fmt}}, {interval.high * scale:{fmt}}]"


def to_markdown(analysis: TraceAnalysis, plot: str | None = None) -> str:
    k = analysis.traces
    lines = [
        f"## Traces: {analysis.questions} questions x {k} traces",
        "",
        f"Single trace {analysis.single_accuracy:.1%}; majority@{k} "
        f"{analysis.rules[0].accuracy:.1%}."
        + (
            f" Left out (a trace missing): {', '.join(analysis.incomplete)}."
            if analysis.incomplete
            else ""
        ),
        "",
        f"Hypotheses of `{PREREGS[analysis.prereg].document}`:",
        "",
        "| hypothesis | measured | 95% interval | supported | |",
        "|---|---|---|---|---|",
    ]
    for d in analysis.decisions:
        if d.supported is None:
            value, span = "-", "-"
        elif d.unit == "auroc":
            value, span = f"{d.value:.3f}", _span(d.interval, 1, ".3f")
        else:
            value, span = f"{points(d.value)} points", _span(d.interval)
        supported = {True: "yes", False: "no", None: "pending"}[d.supported]
        lines.append(f"| {d.name}: {d.claim} | {value} | {span} | {supported} | {d.detail} |")
    lines += ["", "Accuracy against k (majority@k over every subset of k traces):", ""]
    lines += ["| k | " + " | ".join(str(j) for j in range(1, k + 1)) + " |"]
    lines += ["|---" * (k + 1) + "|"]
    lines += ["| accuracy | " + " | ".join(f"{a:.1%}" for a in analysis.at_k) + " |", ""]
    lines += ["Within-question AUROC for correctness (pairs of a right and a wrong trace):", ""]
    lines += ["| signal | AUROC | 95% interval | pairs | questions |", "|---|---|---|---|---|"]
    for a in analysis.aurocs:
        value = "-" if a.value is None else f"{a.value:.3f}"
        span = _span(a.interval, 1, ".3f")
        lines.append(f"| {a.signal} | {value} | {span} | {a.pairs:,} | {a.questions} |")
    lines += ["", "Every rule replayed on the recorded traces in sample order:", ""]
    lines += [
        "| rule | accuracy | tokens / question | vs majority | traces / question | stopped |",
        "|---|---|---|---|---|---|",
    ]
    base = analysis.rules[0].tokens_per_question
    for r in analysis.rules:
        lines.append(
            f"| {r.name} | {r.accuracy:.1%} | {r.tokens_per_question:,.0f} | "
            f"{r.tokens_per_question / base:.2f}x | {r.traces_per_question:.2f} | "
            f"{r.stopped_per_question:.2f} |"
        )
    if analysis.live:
        lines += ["", live_markdown(analysis.live, k)]
    if analysis.waiting:
        waiting = ", ".join(analysis.waiting)
        lines += ["", f"Live folders with no question to compare yet: {waiting}."]
    if plot:
        lines += ["", f"![accuracy against tokens]({plot})"]
    return "\n".join(lines) + "\n"


def plot(analysis: TraceAnalysis, path: Path, trace_tokens: float) -> Path:
    """Accuracy against tokens a question: self-consistency at k = 1..K and every rule."""
    fig = Figure(figsize=(9, 4.5))
    ax = fig.subplots()
    ks = range(1, analysis.traces + 1)
    ax.plot(
        [k * trace_tokens for k in ks],
        [a * 100 for a in analysis.at_k],
        "o-",
        label="self-consistency, k = 1..K",
    )
    for rule, marker in zip(analysis.rules[1:], "sD^vP*Xohd<>p", strict=False):
        ax.scatter(rule.tokens_per_question, rule.accuracy * 100, label=rule.name, marker=marker)
    for row in analysis.live:  # live arms run on their own questions: marked apart
        label = f"live: {row.name} ({row.questions} questions)"
        ax.scatter(row.tokens_per_question, row.accuracy * 100, label=label, marker="*", s=150)
    ax.set_xlabel("completion tokens a question")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def trace_section(
    records: Sequence[RunRecord],
    folder: Path,
    *,
    prereg: str = DEFAULT_PREREG,
    arms: Sequence[LiveArm] = (),
    resamples: int,
    seed: int,
) -> tuple[str, dict[str, Any], Path]:
    """The section's markdown, its JSON and its plot for a folder of one setting's several
    samples."""
    analysis = analyse(records, prereg=prereg, arms=arms, resamples=resamples, seed=seed)
    mean_tokens = analysis.rules[0].tokens_per_question / analysis.traces
    path = plot(analysis, folder / PLOT_NAME, mean_tokens)
    document = {
        "questions": analysis.questions,
        "traces": analysis.traces,
        "incomplete": analysis.incomplete,
        "single_accuracy": analysis.single_accuracy,
        "accuracy_at_k": analysis.at_k,
        "auroc": [asdict(a) for a in analysis.aurocs],
        "rules": [
            {k: v for k, v in asdict(r).items() if k != "per_question"} for r in analysis.rules
        ],
        "prereg": PREREGS[analysis.prereg].document,
        "hypotheses": [asdict(d) for d in analysis.decisions],
        "live": [asdict(row) for row in analysis.live],
    }
    return to_markdown(analysis, path.name), document, path


@dataclass(frozen=True)
class OnlineCheck:
    """A live run of a trace rule against what replaying it on recorded traces predicts. It
    passes on accuracy and tokens (the pre-registered check); traces drawn and stopped are
    shown beside them."""

    questions: int
    accuracy: float
    tokens_per_question: float
    traces_per_question: float
    stopped_per_question: float
    predicted: Prediction

    @property
    def passes(self) -> bool:
        inside = lambda value, span: span.low <= value <= span.high  # noqa: E731
        return inside(self.accuracy, self.predicted.accuracy) and inside(
            self.tokens_per_question, self.predicted.tokens
        )


def online_check(recorded: Sequence[RunRecord], live: Sequence[RunRecord]) -> OnlineCheck:
    """`live`: one run per question of a trace rule (its Context in the records); `recorded`:
    the same questions' independent traces. The prediction replays the live run's rule on
    random orders of the recorded traces (`prediction_interval`)."""
    if not live:
        raise ValueError("the live folder has no records")
    configs = {json.dumps(r["trace"]["config"], sort_keys=True) for r in live}
    if len(configs) != 1:
        raise ValueError(f"the live folder mixes {len(configs)} settings: check one rule")
    rules = recorded_context(live[0]["trace"]["config"])
    questions, _ = question_traces(recorded)
    by_id = {q.problem_id: q for q in questions}
    missing = sorted({r["problem_id"] for r in live} - by_id.keys())
    if missing:
        raise ValueError(
            f"no recorded traces for {len(missing)} live questions: {first_ids(missing)}"
        )
    subset = [by_id[r["problem_id"]] for r in live]
    summaries = [r["trace"]["traces"] for r in live]
    return OnlineCheck(
        questions=len(live),
        accuracy=sum(r["correct"] for r in live) / len(live),
        tokens_per_question=sum(total_tokens(r) for r in live) / len(live),
        traces_per_question=sum(len(s) for s in summaries) / len(live),
        stopped_per_question=sum(t["stopped"] for s in summaries for t in s) / len(live),
        predicted=prediction_interval(subset, rules.trace_rules()),
    )


def online_markdown(check: OnlineCheck, recorded: str) -> str:
    verdict = "passes" if check.passes else "fails"
    p = check.predicted

    def row(name: str, live: str, span: stats.Interval, fmt: str) -> str:
        return f"| {name} | {live} | [{span.low:{fmt}}, {span.high:{fmt}}] |\n"

    return (
        f"## Online check against `{recorded}`: {verdict}\n\n"
        "It passes when the live accuracy and tokens a question both fall inside the "
        "predicted intervals; traces drawn and stopped are shown beside them.\n\n"
        "| | live | predicted (2.5-97.5th percentile of 2,000 replays) |\n|---|---|---|\n"
        + row(f"accuracy ({check.questions} questions)", f"{check.accuracy:.1%}", p.accuracy, ".1%")
        + row("tokens / question", f"{check.tokens_per_question:,.0f}", p.tokens, ",.0f")
        + row("traces / question", f"{check.traces_per_question:.2f}", p.traces, ".2f")
        + row("stopped / question", f"{check.stopped_per_question:.2f}", p.stopped, ".2f")
    )
