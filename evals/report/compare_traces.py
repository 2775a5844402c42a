"""What `mur compare` adds for two folders of recorded traces: the first N samples of each
(`--samples N`), and the traces section (majority@k, tokens per trace, the within-question
AUROC of the final momentum, server time and decode rate), all paired on the questions both
folders hold complete. results/prereg-int8.md's "reported, not decided" list is made here.

The numbers come from the functions the report uses on one folder (evals.report.traces,
tables.run_time and has_traces, stats), so a folder compared here reads as in its report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from mur.evals.harness.run_record import RunRecord, setting_of, total_tokens
from mur.evals.report import stats
from mur.evals.report.markdown import duration, points
from mur.evals.report.pairing import SettingRuns, mean_over
from mur.evals.report.rows import RunTime
from mur.evals.report.tables import has_traces, run_time
from mur.evals.report.traces import (
    PRIMARY_SIGNAL,
    SIGNALS,
    Auroc,
    majority_at,
    question_traces,
    within_question_auroc,
)

OVERLAP_S = 0.5
"""Run intervals overlapping by more than this (in total) ran interleaved, not one after the
other (finished_at has millisecond stamps; the slack absorbs float sums)."""


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


def _timed_tokens(records: Sequence[RunRecord]) -> int:
    return sum(total_tokens(r) for r in records if r.get("finished_at"))


def folder_time(selection: Selection) -> FolderTime:
    everything = [*selection.records, *selection.others]
    own, rest = run_time(selection.records), run_time(selection.others)
    whole = run_time(everything)
    interleaved = own.busy_s + rest.busy_s > whole.busy_s + OVERLAP_S
    counted = everything if interleaved else selection.records
    return FolderTime(
        timing=whole if interleaved else own,
        tokens=_timed_tokens(counted),
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
    complete = (len(qa), len(qb))
    qa = [q for q in qa if q.problem_id in common]
    qb = [q for q in qb if q.problem_id in common]
    k = min(len(qa[0].traces), len(qb[0].traces))
    majority_a = {q.problem_id: majority_at(q, k) for q in qa}
    majority_b = {q.problem_id: majority_at(q, k) for q in qb}
    diff = stats.compare_paired(majority_b, majority_a, resamples=resamples, seed=seed)
    assert diff is not None  # common is not empty
    signal = SIGNALS[PRIMARY_SIGNAL]
    return TraceComparison(
        k=k,
        traces=(len(qa[0].traces), len(qb[0].traces)),
        questions=len(common),
        complete=complete,
        incomplete=(sorted(inc_a), sorted(inc_b)),
        majority=(mean_over(majority_a), mean_over(majority_b)),
        majority_diff=diff,
        tokens=(
            mean_over(SettingRuns(a.records).total_tokens(), common),
            mean_over(SettingRuns(b.records).total_tokens(), common),
        ),
        auroc=(
            within_question_auroc(qa, signal, PRIMARY_SIGNAL, resamples=resamples, seed=seed),
            within_question_auroc(qb, signal, PRIMARY_SIGNAL, resamples=resamples, seed=seed),
        ),
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
    span = (
        f" [{points(diff.interval.low)}, {points(diff.interval.high)}]"
        if diff.interval
        else " (one question: no interval)"
    )
    ratio = "-" if tc.tokens_ratio is None else f"{tc.tokens_ratio:.2f}x"
    rate_ratio = "-" if tc.rate_ratio is None else f"{tc.rate_ratio:.2f}x"
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
        f"| completion tokens per trace | {tc.tokens[0]:,.0f} | {tc.tokens[1]:,.0f} | {ratio} |",
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
        f"B / A tokens per server-second: {rate_ratio}.",
        *_time_notes("A", tc.time[0]),
        *_time_notes("B", tc.time[1]),
        "",
        "majority@k: ties go to the answer given first, as in the traces report; AUROC: in "
        "questions with a right and a wrong trace, the share of right/wrong pairs where the "
        "right trace has the lower final momentum (ties one half), interval over questions.",
    ]
    return "\n".join(lines) + "\n"
