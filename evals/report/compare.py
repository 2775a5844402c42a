"""Two results folders side by side (`mur compare`, cli/compare.py): for every setting both ran,
on the questions both answered, the accuracy of each, B - A with its paired bootstrap interval
and the exact sign test, and the tokens per question of each with their ratio; `--samples N`
keeps samples 0..N-1 (`first_samples`), `--margin` adds non-inferiority lines. When both hold
recorded traces of one setting, a traces section follows (`compare_traces`).

The numbers come from the functions the report uses on one folder (evals.report.pairing, traces,
tables.run_time, stats), so a folder compared here reads as in its report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from mur.evals.harness.provenance import served_by
from mur.evals.harness.run_record import RunRecord, setting_of, total_tokens
from mur.evals.report import stats
from mur.evals.report.markdown import duration, points, points_span, ratio, served_lines
from mur.evals.report.pairing import (
    Pairing,
    SettingKey,
    SettingRuns,
    group_settings,
    mean_over,
    pair,
    setting_order,
)
from mur.evals.report.rows import RunTime
from mur.evals.report.tables import run_time
from mur.evals.report.traces import (
    PRIMARY_SIGNAL,
    SIGNALS,
    Auroc,
    has_traces,
    majority_at,
    question_traces,
    within_question_auroc,
)

OVERLAP_S = 0.5
"""Run intervals overlapping by more than this (in total) ran interleaved, not one after the
other (finished_at has millisecond stamps; the slack absorbs float sums)."""


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
        ci = points_span(comparison.interval, " (no interval)")
        verdict = "yes" if non_inferior(comparison, margin) else "no"
        lines.append(
            f"- {_setting(c.key)}: B - A = {points(comparison.difference)} points{ci}: "
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
        p = c.pairing
        lines.append(
            f"| {_setting(c.key)} | {p.n} | {100 * p.reference_accuracy:.1f} | "
            f"{100 * p.accuracy:.1f} | {points(p.comparison.difference)}"
            f"{points_span(p.comparison.interval)} | {p.comparison.p_value:.2f} | "
            f"{p.reference_tokens:,.0f} | {p.tokens:,.0f} | "
            f"{ratio(p.tokens_ratio if p.reference_tokens else None)} |"
        )
    if margin is not None:
        lines += ["", *margin_lines(comparisons, margin)]
    return "\n".join(lines).rstrip("\n") + "\n"


# ---------------------------------------------------------------------------- --samples


@dataclass(frozen=True)
class Selection:
    """The records of one folder that enter the numbers, and the folder's other records."""

    records: list[RunRecord]
    others: list[RunRecord]  # samples >= N, and every record of a question left out
    left_out: list[str]  # questions without all N samples (setting named when several)


def first_samples(records: Sequence[RunRecord], samples: int | None) -> Selection:
    """Records with sample < `samples` of the questions that have all of them (each setting
    apart); every record when `samples` is None."""
    if samples is None:
        return Selection(list(records), [], [])

    def question(r: RunRecord) -> tuple[str, str, str]:
        return r["dataset"], setting_of(r["strategy"], r["gate"], r["gamma"]), r["problem_id"]

    have: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for record in records:
        wanted = have[question(record)]
        if record["sample"] < samples:
            wanted.add(record["sample"])
    complete = {q for q, got in have.items() if len(got) == samples}
    keep = [r for r in records if r["sample"] < samples and question(r) in complete]
    others = [r for r in records if not (r["sample"] < samples and question(r) in complete)]
    several = len({q[:2] for q in have}) > 1
    left_out = sorted(
        f"{dataset} {setting} {pid}" if several else pid
        for (dataset, setting, pid) in have.keys() - complete
    )
    return Selection(keep, others, left_out)


def samples_lines(samples: int, a: Selection, b: Selection) -> list[str]:
    """What --samples kept, for the head of the output."""

    def count(s: Selection) -> str:
        runs = len(s.records) + len(s.others)
        left = ", ".join(s.left_out) if s.left_out else "none"
        return f"{len(s.records):,} of {runs:,} runs; questions left out: {left}"

    which = "sample 0" if samples == 1 else f"samples 0-{samples - 1}"
    return [
        f"Samples: only records with sample < {samples} ({which}) enter every "
        f"number below, in both folders; a question without all {samples} is left out of "
        "every number.  ",
        f"A: {count(a)}.  ",
        f"B: {count(b)}.",
        "",
    ]


# ---------------------------------------------------------------------------- time


@dataclass(frozen=True)
class FolderTime:
    """A folder's server time and decode rate. `interleaved`: the selected runs shared the
    server with the folder's other runs, so `timing` and `tokens` are the whole folder's and
    the selection's time is its tokens at the folder's rate."""

    timing: RunTime
    tokens: int  # generated (completion) tokens of the timed runs counted in `timing`
    interleaved: bool
    selected_runs: int
    selected_tokens: int

    @property
    def rate(self) -> float | None:
        """Generated tokens per server-second."""
        return self.tokens / self.timing.busy_s if self.timing.busy_s > 0 else None


def folder_time(selection: Selection) -> FolderTime:
    everything = [*selection.records, *selection.others]
    own, rest = run_time(selection.records), run_time(selection.others)
    whole = run_time(everything)
    interleaved = own.busy_s + rest.busy_s > whole.busy_s + OVERLAP_S
    counted = everything if interleaved else selection.records
    return FolderTime(
        timing=whole if interleaved else own,
        tokens=sum(total_tokens(r) for r in counted if r.get("finished_at")),
        interleaved=interleaved,
        selected_runs=len(selection.records),
        selected_tokens=sum(total_tokens(r) for r in selection.records),
    )


# ---------------------------------------------------------------------------- traces


def _traced(records: Sequence[RunRecord]) -> bool:
    """Several samples of one setting, each record carrying its trace (a test double's or an
    old record's empty trace has no section rather than a crash)."""
    return has_traces(records) and all("config" in (r.get("trace") or {}) for r in records)


@dataclass(frozen=True)
class TraceComparison:
    """B's traces against A's on the questions both hold complete. Pairs are (A, B)."""

    k: int  # majority@k: the fewer traces a question of the two folders
    traces: tuple[int, int]  # traces a question
    questions: int  # paired
    complete: tuple[int, int]  # questions with all their traces, per folder
    incomplete: tuple[list[str], list[str]]  # questions left out for a missing trace
    majority: tuple[float, float]
    majority_diff: stats.PairedComparison  # B - A per question
    tokens: tuple[float, float]  # completion tokens per trace
    auroc: tuple[Auroc, Auroc]  # of PRIMARY_SIGNAL
    time: tuple[FolderTime, FolderTime]

    @property
    def tokens_ratio(self) -> float | None:
        return self.tokens[1] / self.tokens[0] if self.tokens[0] else None

    @property
    def rate_ratio(self) -> float | None:
        a, b = (t.rate for t in self.time)
        return b / a if a and b is not None else None


def compare_traces(
    a: Selection,
    b: Selection,
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> TraceComparison | None:
    """None unless both selections are recorded traces of one setting with a common question."""
    if not (_traced(a.records) and _traced(b.records)):
        return None
    (qa, inc_a), (qb, inc_b) = question_traces(a.records), question_traces(b.records)
    common = sorted({q.problem_id for q in qa} & {q.problem_id for q in qb})
    if not common:
        return None
    paired = [q for q in qa if q.problem_id in common], [q for q in qb if q.problem_id in common]
    k = min(len(qs[0].traces) for qs in paired)
    majority_a, majority_b = ({q.problem_id: majority_at(q, k) for q in qs} for qs in paired)
    diff = stats.compare_paired(majority_b, majority_a, resamples=resamples, seed=seed)
    assert diff is not None  # common is not empty
    signal = SIGNALS[PRIMARY_SIGNAL]
    auroc_a, auroc_b = (
        within_question_auroc(qs, signal, PRIMARY_SIGNAL, resamples=resamples, seed=seed)
        for qs in paired
    )
    tokens_a, tokens_b = (mean_over(SettingRuns(s.records).total_tokens(), common) for s in (a, b))
    return TraceComparison(
        k=k,
        traces=(len(paired[0][0].traces), len(paired[1][0].traces)),
        questions=len(common),
        complete=(len(qa), len(qb)),
        incomplete=(sorted(inc_a), sorted(inc_b)),
        majority=(mean_over(majority_a), mean_over(majority_b)),
        majority_diff=diff,
        tokens=(tokens_a, tokens_b),
        auroc=(auroc_a, auroc_b),
        time=(folder_time(a), folder_time(b)),
    )


# ---------------------------------------------------------------------------- output


def _auroc(a: Auroc) -> str:
    if a.value is None or a.interval is None:
        return "- (no question with a right and a wrong trace)"
    return (
        f"{a.value:.3f} [{a.interval.low:.3f}, {a.interval.high:.3f}], "
        f"{a.pairs:,} pairs in {a.questions} questions"
    )


def _time_row(name: str, t: FolderTime) -> str:
    rate = "-" if t.rate is None else f"{t.rate:.2f}"
    return (
        f"| {name} | {t.timing.timed_runs:,} of {t.timing.runs:,} | {duration(t.timing.busy_s)} "
        f"| {t.tokens:,} | {rate} |"
    )


def _time_notes(name: str, t: FolderTime) -> list[str]:
    notes = []
    if t.interleaved:
        others = t.timing.runs - t.selected_runs
        took = duration(t.selected_tokens / t.rate) if t.rate else None
        estimate = f": at its rate their {t.selected_tokens:,} tokens take {took}" if took else ""
        notes.append(
            f"{name}'s {t.selected_runs:,} selected runs ran interleaved with its {others:,} runs "
            "outside --samples, so its time is the folder's, compared per token"
            f"{estimate}."
        )
    if untimed := t.timing.runs - t.timing.timed_runs:
        notes.append(f"{name}: {untimed:,} runs carry no finished_at stamp and are not timed.")
    return notes


def traces_markdown(tc: TraceComparison) -> str:
    """The traces section of `mur compare`'s output."""
    (ka, kb), k = tc.traces, tc.k
    incomplete = "; ".join(
        f"{name}: {', '.join(ids) if ids else 'none'}"
        for name, ids in zip("AB", tc.incomplete, strict=True)
    )
    diff = tc.majority_diff
    span = points_span(diff.interval, " (one question: no interval)")
    lines = [
        f"## Traces: majority@{k}, tokens per trace, the final momentum's AUROC, time",
        "",
        f"Paired on the {tc.questions} questions with all their traces in both folders (A: "
        f"{ka} traces a question, {tc.complete[0]} such questions; B: {kb}, "
        f"{tc.complete[1]}). Left out for a missing trace: {incomplete}."
        + (
            f" majority@{k} of {'A' if ka > kb else 'B'} is averaged over every {k} of its "
            f"{max(ka, kb)} traces."
            if ka != kb
            else ""
        ),
        "",
        "| | A | B | B - A, points [95% CI] or B / A |",
        "|---|---|---|---|",
        f"| majority@{k} accuracy % | {100 * tc.majority[0]:.1f} | {100 * tc.majority[1]:.1f} "
        f"| {points(diff.difference)}{span}, better / worse {diff.better} / {diff.worse}, "
        f"exact p {diff.p_value:.2f} |",
        f"| completion tokens per trace | {tc.tokens[0]:,.0f} | {tc.tokens[1]:,.0f} "
        f"| {ratio(tc.tokens_ratio)} |",
        f"| within-question AUROC, {PRIMARY_SIGNAL} | {_auroc(tc.auroc[0])} "
        f"| {_auroc(tc.auroc[1])} | - |",
        "",
        "Server time (the union of the timed runs' intervals) and generated tokens per "
        "server-second:",
        "",
        "| folder | timed runs | server time | generated tokens | tokens per server-second |",
        "|---|---|---|---|---|",
        _time_row("A", tc.time[0]),
        _time_row("B", tc.time[1]),
        "",
        f"B / A tokens per server-second: {ratio(tc.rate_ratio)}.",
        *_time_notes("A", tc.time[0]),
        *_time_notes("B", tc.time[1]),
        "",
        "majority@k: ties go to the answer given first, as in the traces report; AUROC: in "
        "questions with a right and a wrong trace, the share of right/wrong pairs where the "
        "right trace has the lower final momentum (ties one half), interval over questions.",
    ]
    return "\n".join(lines) + "\n"
