"""Live trace rules beside recorded traces: a folder where each question was solved once by a
rule that draws its traces itself (branching, settling, stopping: `mur solve --traces ...`),
compared per question with the vote of a folder of the same questions' independent traces.

A rule that branches cannot be replayed on independent traces (a branch's steps after the
branch point were never drawn), so it runs live, and is judged against majority@K of the
recorded traces, paired per question.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from mur.evals.harness.records import records_so_far
from mur.evals.harness.run_record import RunRecord, setting_of, total_tokens
from mur.evals.report import stats
from mur.evals.report.markdown import points
from mur.evals.report.traces import Replayed
from mur.nodes.branching import BRANCH_RULES


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
    parents: int
    """The first batch's traces (the warm-ups a branch may start from)."""
    parents_with_points: int | None
    """Of those, how many offered the branch rule a point (EAGer's: a token over its entropy
    threshold); None where the records do not say (written before `branch_points` was)."""


@dataclass(frozen=True)
class LiveArm:
    """A live folder under a name (`mur`, `random`, ...): its rule and its questions."""

    name: str
    folder: str
    rule: str
    """The trace settings that differ from one plain trace (the folder's Context)."""
    per_question: Mapping[str, LiveQuestion]
    config: Mapping[str, Any]
    """Its trace settings (TRACE_FIELDS), as its records' Context has them."""


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


def first_ids(ids: Sequence[str], shown: int = 5) -> str:
    """Up to `shown` question ids and how many more: how a message names the questions at fault."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more


def load_arm(name: str, folder: str | Path) -> LiveArm:
    """The live folder's one run per question (its first sample), with its rule; a folder
    the run has not written into yet is an arm without questions (its hypotheses wait)."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"the live folder {folder} ({name}) does not exist")
    records = records_so_far(folder)
    settings = {setting_of(r["strategy"], r["gate"], r["gamma"]) for r in records}
    configs = {tuple((f, r["trace"]["config"].get(f)) for f in TRACE_FIELDS) for r in records}
    if len(settings) > 1 or len(configs) > 1:
        raise ValueError(f"the live folder {folder} mixes settings: compare one rule at a time")
    config = dict(next(iter(configs), ()))
    first = config.get("trace_batch") or 1
    per_question = {r["problem_id"]: _question(r, first) for r in records if r["sample"] == 0}
    rule = ", ".join(f"{field} {value}" for field, value in config.items() if value is not None)
    return LiveArm(name, str(folder), rule or "no records yet", per_question, config)


def _question(record: RunRecord, first_batch: int) -> LiveQuestion:
    summaries = record["trace"].get("traces") or []
    usage = record["usage"]
    warmups = [s for s in summaries if s["index"] < first_batch]
    points = [s.get("branch_points") for s in warmups]
    return LiveQuestion(
        correct=bool(record["correct"]),
        tokens=total_tokens(record),
        prompt_tokens=usage.get("backbone_prompt_tokens", 0)
        + usage.get("external_prompt_tokens", 0),
        drawn=len(summaries),
        branched=sum(1 for s in summaries if s.get("parent") is not None),
        stopped=sum(1 for s in summaries if s["stopped"]),
        parents=len(warmups),
        parents_with_points=None if None in points else sum(1 for n in points if n),
    )


def restricted(
    arm: LiveArm,
    complete: Collection[str],
    incomplete: Collection[str],
    *,
    recording: bool = False,
) -> tuple[LiveArm, list[str], list[str]]:
    """`arm` on the questions whose recorded traces are complete; the ids it ran whose
    recorded traces are incomplete (the pre-registered exclusion), and those the recorded
    folder has none of yet. While that folder is `recording` (short of its planned questions)
    the latter wait; once it is not, a live question it never ran is an error (the wrong
    folders paired): say which."""
    unknown = sorted(set(arm.per_question) - set(complete) - set(incomplete))
    if unknown and not recording:
        raise ValueError(
            f"{len(unknown)} questions of {arm.folder} have no recorded traces to compare "
            f"with: {first_ids(unknown)}"
        )
    left_out = sorted(set(arm.per_question) & set(incomplete))
    kept = {q: v for q, v in arm.per_question.items() if q in complete}
    return replace(arm, per_question=kept), left_out, unknown


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
    parents: int
    parents_with_points: int | None
    """Warm-ups, and those offering the branch rule a point, over its questions (None: not
    recorded)."""
    branch: str | None = None
    """Its branch rule's registry name (nodes/branching.py), None where it draws no branch."""
    left_out: tuple[str, ...] = ()
    """Questions it ran whose recorded traces are incomplete (not compared)."""
    unrecorded: int = 0
    """Questions it ran that the recorded folder has no trace of yet (not compared)."""


def compare(
    arm: LiveArm,
    majority: Mapping[str, Replayed],
    *,
    left_out: Sequence[str] = (),
    unrecorded: int = 0,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> LiveRow:
    """`arm` (`restricted` to the recorded questions) against majority@K (`majority`: the
    replayed vote per recorded question) on the questions it ran; `left_out` is named beside."""
    if not arm.per_question:
        raise ValueError(f"the live folder {arm.folder} has no question to compare yet")
    if missing := sorted(set(arm.per_question) - set(majority)):
        raise ValueError(f"{len(missing)} questions of {arm.folder} have no majority vote")
    ids = sorted(arm.per_question)
    live = [arm.per_question[q] for q in ids]
    difference, interval = paired_difference(
        arm.per_question, majority, ids, resamples=resamples, seed=seed
    )

    return LiveRow(
        name=arm.name,
        folder=arm.folder,
        rule=arm.rule,
        questions=len(ids),
        accuracy=stats.mean([q.correct for q in live]),
        tokens_per_question=stats.mean([q.tokens for q in live]),
        prompt_tokens_per_question=stats.mean([q.prompt_tokens for q in live]),
        traces_per_question=stats.mean([q.drawn for q in live]),
        branched_per_question=stats.mean([q.branched for q in live]),
        stopped_per_question=stats.mean([q.stopped for q in live]),
        majority_accuracy=stats.mean([majority[q].correct for q in ids]),
        difference=difference,
        interval=interval,
        token_ratio=sum(q.tokens for q in live) / sum(majority[q].tokens for q in ids),
        parents=sum(q.parents for q in live),
        parents_with_points=(
            None
            if any(q.parents_with_points is None for q in live)
            else sum(q.parents_with_points or 0 for q in live)
        ),
        branch=arm.config.get("branch"),
        left_out=tuple(left_out),
        unrecorded=unrecorded,
    )


class Graded(Protocol):
    @property
    def correct(self) -> bool: ...


def paired_difference(
    a: Mapping[str, Graded],
    b: Mapping[str, Graded],
    ids: Sequence[str],
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> tuple[float, stats.Interval | None]:
    """Accuracy a - b on questions `ids` (both graded each), paired per question, with its
    bootstrap interval: live arms against each other or against majority@K, replayed rules."""
    if not ids:
        raise ValueError("no question in common to pair")
    diffs = [float(a[q].correct) - float(b[q].correct) for q in ids]
    return stats.mean(diffs), stats.bootstrap_interval(diffs, resamples=resamples, seed=seed)


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
            "-" if r.interval is None else f"[{points(r.interval.low)}, {points(r.interval.high)}]"
        )
        lines.append(
            f"| {r.name} (`{r.folder}`: {r.rule}) | {r.questions} | {r.accuracy:.1%} | "
            f"{r.majority_accuracy:.1%} | {points(r.difference)} {span} | "
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
