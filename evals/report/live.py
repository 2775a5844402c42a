"""Live trace rules beside recorded traces: a folder where each question was solved once by a
rule that draws its traces itself (branching, settling, stopping: `mur solve --traces ...`),
compared per question with the vote of a folder of the same questions' independent traces.

A rule that branches cannot be replayed on independent traces (a branch's steps after the
branch point were never drawn), so it runs live, and is judged against majority@K of the
recorded traces, paired per question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mur.evals.harness.records import load_records
from mur.evals.harness.run_record import RunRecord, setting_of, total_tokens
from mur.evals.report import stats
from mur.evals.report.traces import Replayed


@dataclass(frozen=True)
class LiveQuestion:
    """One question solved live: right or not, completion and prompt tokens, and its traces:
    drawn, branched off another, stopped part-way."""

    correct: bool
    tokens: int
    prompt_tokens: int
    drawn: int
    branched: int
    stopped: int


@dataclass(frozen=True)
class LiveArm:
    """A live folder under a name (`mur`, `random`, ...): its rule and its questions."""

    name: str
    folder: str
    rule: str
    """The trace settings that differ from one plain trace (the folder's Context)."""
    per_question: Mapping[str, LiveQuestion]


TRACE_FIELDS = (
    "traces",
    "trace_batch",
    "branch",
    "branch_entropy",
    "settle",
    "trace_stop",
    "stop_keep",
    "vote",
)


def load_arm(name: str, folder: str | Path) -> LiveArm:
    """The live folder's one run per question (its first sample), with its rule."""
    records = load_records(folder)
    if not records:
        raise ValueError(f"the live folder {folder} has no records")
    settings = {setting_of(r["strategy"], r["gate"], r["gamma"]) for r in records}
    configs = {tuple((f, r["trace"]["config"].get(f)) for f in TRACE_FIELDS) for r in records}
    if len(settings) != 1 or len(configs) != 1:
        raise ValueError(f"the live folder {folder} mixes settings: compare one rule at a time")
    per_question = {r["problem_id"]: _question(r) for r in records if r["sample"] == 0}
    (config,) = configs
    rule = ", ".join(f"{field} {value}" for field, value in config if value is not None)
    return LiveArm(name, str(folder), rule, per_question)


def _question(record: RunRecord) -> LiveQuestion:
    summaries = record["trace"].get("traces") or []
    usage = record["usage"]
    return LiveQuestion(
        correct=bool(record["correct"]),
        tokens=total_tokens(record),
        prompt_tokens=usage.get("backbone_prompt_tokens", 0)
        + usage.get("external_prompt_tokens", 0),
        drawn=len(summaries),
        branched=sum(1 for s in summaries if s.get("parent") is not None),
        stopped=sum(1 for s in summaries if s["stopped"]),
    )


@dataclass(frozen=True)
class LiveRow:
    """A live arm against majority@K of the recorded traces on the questions both have."""

    name: str
    folder: str
    rule: str
    questions: int
    accuracy: float
    tokens_per_question: float
    prompt_tokens_per_question: float
    traces_per_question: float
    branched_per_question: float
    stopped_per_question: float
    majority_accuracy: float
    difference: float
    """Accuracy (live - majority@K) in points of 1, paired per question."""
    interval: stats.Interval | None
    token_ratio: float
    """The live arm's completion tokens over majority@K's, summed over the same questions."""


def compare(
    arm: LiveArm,
    majority: Mapping[str, Replayed],
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> LiveRow:
    """`arm` against majority@K (`majority`: the replayed vote per recorded question) on the
    questions both have; a live question without recorded traces is an error (say which)."""
    missing = sorted(set(arm.per_question) - set(majority))
    if missing:
        raise ValueError(
            f"{len(missing)} questions of {arm.folder} have no recorded traces to compare "
            f"with: {', '.join(missing[:3])}"
        )
    ids = sorted(arm.per_question)
    live = [arm.per_question[q] for q in ids]
    diffs = [float(arm.per_question[q].correct) - float(majority[q].correct) for q in ids]

    def mean(values: Sequence[float]) -> float:
        return float(np.mean(values))

    return LiveRow(
        name=arm.name,
        folder=arm.folder,
        rule=arm.rule,
        questions=len(ids),
        accuracy=mean([q.correct for q in live]),
        tokens_per_question=mean([q.tokens for q in live]),
        prompt_tokens_per_question=mean([q.prompt_tokens for q in live]),
        traces_per_question=mean([q.drawn for q in live]),
        branched_per_question=mean([q.branched for q in live]),
        stopped_per_question=mean([q.stopped for q in live]),
        majority_accuracy=mean([majority[q].correct for q in ids]),
        difference=mean(diffs),
        interval=stats.bootstrap_interval(diffs, resamples=resamples, seed=seed),
        token_ratio=sum(q.tokens for q in live) / sum(majority[q].tokens for q in ids),
    )


def paired_difference(
    a: LiveArm, b: LiveArm, *, resamples: int = stats.RESAMPLES, seed: int = stats.SEED
) -> tuple[float, stats.Interval | None, int]:
    """Accuracy (a - b) on the questions both ran, paired per question, and how many."""
    ids = sorted(set(a.per_question) & set(b.per_question))
    if not ids:
        raise ValueError(f"{a.folder} and {b.folder} have no question in common")
    diffs = [float(a.per_question[q].correct) - float(b.per_question[q].correct) for q in ids]
    interval = stats.bootstrap_interval(diffs, resamples=resamples, seed=seed)
    return float(np.mean(diffs)), interval, len(ids)


def markdown(rows: Sequence[LiveRow], k: int) -> str:
    """The live arms' table, each against majority@K on its questions."""
    if not rows:
        return ""
    lines = [
        f"Live rules, each against majority@{k} of these traces on the questions it ran:",
        "",
        f"| arm | questions | accuracy | majority@{k} | difference [95%] | tokens / question "
        f"| vs majority | prompt tokens / question | traces | branched | stopped |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        span = (
            "-"
            if r.interval is None
            else f"[{r.interval.low * 100:+.1f}, {r.interval.high * 100:+.1f}]"
        )
        lines.append(
            f"| {r.name} (`{r.folder}`: {r.rule}) | {r.questions} | {r.accuracy:.1%} | "
            f"{r.majority_accuracy:.1%} | {r.difference * 100:+.1f} {span} | "
            f"{r.tokens_per_question:,.0f} | {r.token_ratio:.2f}x | "
            f"{r.prompt_tokens_per_question:,.0f} | {r.traces_per_question:.2f} | "
            f"{r.branched_per_question:.2f} | {r.stopped_per_question:.2f} |"
        )
    return "\n".join(lines) + "\n"
