"""The trace section of a report: an experiment's rules replayed on the recorded traces with
the live folders beside them (both measured in evals.report.traces), its hypotheses decided on
both, accuracy against k, the AUROC table, the live arms' table and one plot of accuracy
against tokens for every rule. Kept apart from the measuring because it reads the experiment
(evals.report.experiment), which reads the measures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.experiment import (
    MAJORITY,
    Decision,
    Evidence,
    Experiment,
    decisions_json,
    decisions_markdown,
    still_recording,
)
from mur.evals.report.markdown import points, points_span, table
from mur.evals.report.traces import (
    SIGNALS,
    Auroc,
    LiveArm,
    LiveRow,
    RuleResult,
    compare_live,
    majority_at,
    question_traces,
    restricted,
    run_rule,
    within_question_auroc,
)
from mur.nodes.branching import BRANCH_RULES

PLOT_NAME = "traces_accuracy_vs_tokens.png"


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
    experiment: Experiment | None
    live: list[LiveRow]
    waiting: list[str]
    """Live folders given with no question to compare yet (their run has not finished one)."""


def analyse(
    records: Sequence[RunRecord],
    *,
    experiment: Experiment | None = None,
    arms: Sequence[LiveArm] = (),
    headline_gamma: float,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> TraceAnalysis:
    """Majority@K and the experiment's rules replayed on the recorded traces, the live arms
    beside them, and the experiment's hypotheses decided on both."""
    questions, incomplete = question_traces(records)
    if not questions:
        raise ValueError("no question has all its traces recorded")
    k = len(questions[0].traces)
    replayed = {"majority": MAJORITY, **(experiment.rules if experiment else {})}
    rules = {
        name: run_rule(rule.label, questions, rule.rules(k)) for name, rule in replayed.items()
    }
    majority = rules["majority"].per_question
    planned = experiment.questions if experiment else None
    kept: dict[str, LiveArm] = {}
    rows: dict[str, LiveRow] = {}
    recorded = len(questions) + len(incomplete)
    recording = still_recording(recorded, planned)
    for arm in arms:
        if experiment is not None:
            experiment.check_arm(arm)
        kept[arm.name], left_out, unrecorded = restricted(
            arm, majority, incomplete, recording=recording
        )
        if kept[arm.name].per_question:
            rows[arm.name] = compare_live(
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
    evidence = Evidence(
        records,
        headline_gamma,
        resamples,
        seed,
        questions=questions,
        recorded=recorded,
        k=k,
        rules=rules,
        aurocs=aurocs,
        arms=kept,
        rows=rows,
        planned=planned,
    )
    return TraceAnalysis(
        questions=len(questions),
        traces=k,
        incomplete=sorted(incomplete),
        single_accuracy=float(sum(q.single_accuracy for q in questions) / len(questions)),
        at_k=[sum(majority_at(q, j) for q in questions) / len(questions) for j in range(1, k + 1)],
        aurocs=aurocs,
        rules=list(rules.values()),
        decisions=experiment.decide(evidence) if experiment else [],
        experiment=experiment,
        live=list(rows.values()),
        waiting=[f"{a.name} (`{a.folder}`)" for a in kept.values() if a.name not in rows],
    )


# ---------------------------------------------------------------------------- output


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
        decisions_markdown(analysis.experiment, analysis.decisions)
        if analysis.experiment
        else "No experiment's hypotheses decided here: `mur report DIR --prereg NAME` decides "
        "one's.",
    ]
    lines += ["", "Accuracy against k (majority@k over every subset of k traces):", ""]
    at_k = [["accuracy", *(f"{a:.1%}" for a in analysis.at_k)]]
    lines += [*table(["k", *map(str, range(1, k + 1))], at_k), ""]
    lines += ["Within-question AUROC for correctness (pairs of a right and a wrong trace):", ""]
    lines += ["| signal | AUROC | 95% interval | pairs | questions |", "|---|---|---|---|---|"]
    for a in analysis.aurocs:
        value = "-" if a.value is None else f"{a.value:.3f}"
        span = "-" if a.interval is None else f"[{a.interval.low:.3f}, {a.interval.high:.3f}]"
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
        lines += ["", _live_markdown(analysis.live, k)]
    if analysis.waiting:
        waiting = ", ".join(analysis.waiting)
        lines += ["", f"Live folders with no question to compare yet: {waiting}."]
    if plot:
        lines += ["", f"![accuracy against tokens]({plot})"]
    return "\n".join(lines) + "\n"


def _live_markdown(rows: Sequence[LiveRow], k: int) -> str:
    """The live arms' table, each against majority@K on its questions."""
    lines = [
        f"Live rules, each against majority@{k} of these traces on the questions it ran:",
        "",
        f"| arm | questions | accuracy | majority@{k} | difference [95%] | tokens / question "
        f"| vs majority | prompt tokens / question | traces | branched | stopped |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        span = points_span(r.interval, " -")
        lines.append(
            f"| {r.name} (`{r.folder}`: {r.rule}) | {r.questions} | {r.accuracy:.1%} | "
            f"{r.majority_accuracy:.1%} | {points(r.difference)}{span} | "
            f"{r.tokens_per_question:,.0f} | {r.token_ratio:.2f}x | "
            f"{r.prompt_tokens_per_question:,.0f} | {r.traces_per_question:.2f} | "
            f"{r.branched_per_question:.2f} | {r.stopped_per_question:.2f} |"
        )
    lines.append("")
    for r in rows:
        if r.parents_with_points is not None and r.branch in BRANCH_RULES:
            lines.append(
                f"- {r.name}: {r.parents_with_points} of {r.parents} warm-up traces offered "
                f"its rule a branch point ({r.branch}: {BRANCH_RULES[r.branch].description})."
            )
        if r.left_out:
            lines.append(
                f"- {r.name}: not compared, the recorded traces incomplete: "
                f"{', '.join(r.left_out)}."
            )
        if r.unrecorded:
            lines.append(
                f"- {r.name}: {r.unrecorded} questions not compared yet: the recorded folder "
                "has no trace of them."
            )
    return "\n".join(lines).rstrip() + "\n"


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
    experiment: Experiment | None,
    arms: Sequence[LiveArm] = (),
    headline_gamma: float,
    resamples: int,
    seed: int,
) -> tuple[str, dict[str, Any], Path]:
    """The section's markdown, its JSON and its plot for a folder of one setting's several
    samples."""
    analysis = analyse(
        records,
        experiment=experiment,
        arms=arms,
        headline_gamma=headline_gamma,
        resamples=resamples,
        seed=seed,
    )
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
        **decisions_json(analysis.experiment, analysis.decisions),
        "live": [asdict(row) for row in analysis.live],
    }
    return to_markdown(analysis, path.name), document, path
